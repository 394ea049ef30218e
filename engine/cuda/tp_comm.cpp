#include "engine/cuda/tp_comm.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "kernels/cuda_check.cuh"

namespace moebatch {
namespace {

// Why the peer-to-peer all-reduce cannot join `devices` (empty when it can).
std::string p2p_refusal(const std::vector<int>& devices) {
  const int world = static_cast<int>(devices.size());
  if (world < 2 || world > kernels::kAllReduceMaxWorld)
    return "it joins 2.." + std::to_string(kernels::kAllReduceMaxWorld) + " ranks";
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can)
        return "cuda:" + std::to_string(a) + " cannot access cuda:" + std::to_string(b) +
               " as a peer";
    }
  return {};
}

}  // namespace

TpComm::TpComm(const std::vector<int>& devices, size_t p2p_max_bytes)
    : nccl_(std::make_unique<NcclComm>(devices)) {
  if (p2p_max_bytes == 0) {
    spdlog::info("tensor parallel all-reduce: NCCL only (custom all-reduce disabled)");
    return;
  }
  const std::string refusal = p2p_refusal(devices);
  if (!refusal.empty()) {
    spdlog::warn("tensor parallel all-reduce: NCCL only ({})", refusal);
    return;
  }
  p2p_ = std::make_unique<kernels::AllReduceWorkspace>(devices, p2p_max_bytes);
  spdlog::info("tensor parallel all-reduce: peer-to-peer up to {} KiB (fused with add + RMSNorm), "
               "NCCL above",
               p2p_max_bytes >> 10);
}

// The workspace goes before NCCL (members in reverse order); both after the ranks' graphs.
TpComm::~TpComm() = default;

size_t TpComm::p2p_bytes_per_device(int world, size_t p2p_max_bytes) {
  if (p2p_max_bytes == 0 || world < 2 || world > kernels::kAllReduceMaxWorld) return 0;
  return kernels::AllReduceWorkspace::bytes_per_device(world, p2p_max_bytes);
}

void TpComm::all_reduce_sum(int rank, void* data, size_t count, CommDType dtype,
                            CommStream stream) {
  if (p2p_ && dtype == CommDType::Bf16 && count % 8 == 0 &&
      p2p_->fits(count * comm_dtype_bytes(dtype))) {
    if (aborted()) throw Error(abort_reason());
    auto* x = static_cast<kernels::bf16*>(data);
    kernels::allreduce_sum(*p2p_, rank, {.out = x, .in = x, .count = count},
                           static_cast<cudaStream_t>(stream));
    return;
  }
  nccl_->all_reduce_sum(rank, data, count, dtype, stream);
}

void TpComm::all_gather(int rank, const void* send, void* recv, size_t count, CommDType dtype,
                        CommStream stream) {
  nccl_->all_gather(rank, send, recv, count, dtype, stream);
}

void TpComm::abort(const std::string& reason) {
  if (p2p_) p2p_->abort();
  nccl_->abort(reason);
}

}  // namespace moebatch
