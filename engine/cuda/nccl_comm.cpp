#include "engine/cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "common/error.h"
#include "kernels/cuda_check.cuh"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0),
              "NcclComm needs NCCL >= 2.18 (bf16, graph capture, abort from another thread)");

namespace moebatch {
namespace {

// How long abort() lets a rank finish an NCCL call it is inside before freeing the clique under
// it. Enqueueing a collective takes microseconds; a call blocked on a peer (NCCL connects lazily
// on first use) only returns once the abort flag is set, so it is not waited for past this.
constexpr auto kAbortGrace = std::chrono::seconds(2);

ncclDataType_t nccl_type(CommDType t) { return t == CommDType::F32 ? ncclFloat32 : ncclBfloat16; }

}  // namespace

// Rank r inside an NCCL call. Dekker-style with abort(): the rank publishes in_call_[r] and then
// reads aborted_; abort() publishes aborted_ and then reads in_call_ (all sequentially
// consistent). So either the rank sees the abort and never enters NCCL, or abort() sees the rank
// inside and waits for it to leave before ncclCommAbort frees the communicator.
class NcclComm::Call {
 public:
  Call(NcclComm& c, int rank) : c_(c), rank_(rank) {
    MB_CHECK(rank >= 0 && rank < c.world(), "NcclComm: rank out of range");
    c_.in_call_[rank_].store(1);
    if (c_.aborted_.load()) {
      c_.in_call_[rank_].store(0);
      throw Error(c_.abort_reason());
    }
  }
  ~Call() { c_.in_call_[rank_].store(0); }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

 private:
  NcclComm& c_;
  int rank_;
};

NcclComm::NcclComm(const std::vector<int>& devices)
    : comms_(devices.size(), nullptr),
      in_call_(std::make_unique<std::atomic<int>[]>(devices.size())) {
  MB_CHECK(!devices.empty(), "NcclComm: no devices");
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  std::string names;
  for (int d : devices) names += (names.empty() ? "cuda:" : ",cuda:") + std::to_string(d);
  // One group over every device (NCCL sets and restores the current device itself). On failure
  // the ranks it did create are released here: the destructor does not run.
  const ncclResult_t res =
      ncclCommInitAll(comms_.data(), static_cast<int>(devices.size()), devices.data());
  if (res != ncclSuccess) {
    for (ncclComm* c : comms_)
      if (c) ncclCommAbort(c);
    throw Error(fmt::format("NCCL ncclCommInitAll on {}: {} ({})", names, ncclGetErrorString(res),
                            ncclGetLastError(nullptr)));
  }
  spdlog::info("nccl {}.{}.{}: {} ranks on {}", version / 10000, version / 100 % 100, version % 100,
               devices.size(), names);
}

NcclComm::~NcclComm() {
  if (aborted_.load()) return;  // ncclCommAbort released the clique
  int prev = -1;
  const bool had_device = cudaGetDevice(&prev) == cudaSuccess;
  // A healthy clique is destroyed (NCCL's intra-node barrier runs on its own threads after the
  // last rank's call); one with an asynchronous error is aborted, so a broken peer cannot hold
  // the destructor in that barrier.
  const bool healthy = async_error().empty();
  for (ncclComm* c : comms_) {
    if (!c) continue;
    const ncclResult_t res = healthy ? ncclCommDestroy(c) : ncclCommAbort(c);
    if (res != ncclSuccess)
      spdlog::warn("nccl: releasing a communicator failed: {}", ncclGetErrorString(res));
  }
  if (had_device) cudaSetDevice(prev);
}

void NcclComm::check(int rank, int result, const char* what) const {
  const auto res = static_cast<ncclResult_t>(result);
  if (res == ncclSuccess) return;
  if (aborted_.load()) throw Error(abort_reason());
  throw Error(fmt::format("NCCL {} on rank {}: {} ({})", what, rank, ncclGetErrorString(res),
                          ncclGetLastError(comms_[rank])));
}

void NcclComm::all_reduce_sum(int rank, void* data, size_t count, CommDType dtype,
                              CommStream stream) {
  const Call call(*this, rank);
  check(rank,
        ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comms_[rank],
                      static_cast<cudaStream_t>(stream)),
        "ncclAllReduce");
}

void NcclComm::all_gather(int rank, const void* send, void* recv, size_t count, CommDType dtype,
                          CommStream stream) {
  const Call call(*this, rank);
  check(rank,
        ncclAllGather(send, recv, count, nccl_type(dtype), comms_[rank],
                      static_cast<cudaStream_t>(stream)),
        "ncclAllGather");
}

std::string NcclComm::async_error() {
  if (aborted_.load()) return {};
  for (size_t r = 0; r < comms_.size(); ++r) {
    ncclResult_t err = ncclSuccess;
    const ncclResult_t res = ncclCommGetAsyncError(comms_[r], &err);
    if (res != ncclSuccess)
      return fmt::format("NCCL ncclCommGetAsyncError on rank {}: {}", r, ncclGetErrorString(res));
    if (err != ncclSuccess && err != ncclInProgress) {
      return fmt::format("NCCL error on rank {}: {} ({})", r, ncclGetErrorString(err),
                         ncclGetLastError(comms_[r]));
    }
  }
  return {};
}

void NcclComm::abort(const std::string& reason) {
  {
    std::lock_guard lk(mu_);
    if (aborted_.load()) return;
    reason_ = reason;
    aborted_.store(true);
  }
  const auto deadline = std::chrono::steady_clock::now() + kAbortGrace;
  for (size_t r = 0; r < comms_.size(); ++r) {
    while (in_call_[r].load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Each call sets its rank's abort flag first (kernels and host waits of that rank return);
  // the last one also reclaims the clique, which waits for captured graphs to be destroyed.
  for (size_t r = 0; r < comms_.size(); ++r) {
    const ncclResult_t res = ncclCommAbort(comms_[r]);
    if (res != ncclSuccess)
      spdlog::warn("nccl: ncclCommAbort on rank {} failed: {}", r, ncclGetErrorString(res));
  }
  spdlog::warn("nccl: communicators aborted ({})", reason);
}

std::string NcclComm::abort_reason() const {
  std::lock_guard lk(mu_);
  return reason_;
}

}  // namespace moebatch
