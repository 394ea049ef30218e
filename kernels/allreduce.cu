// One-shot push all-reduce between the devices of one process, and its fusion with the residual
// add + RMSNorm that follows the all-reduce in every transformer block.
//
// Memory per rank (one allocation on its device): flags [kMaxBlocks][kMaxWorld] u64, epochs
// [kMaxBlocks] u64, then receive slots recv[2 parities][world][slot_elems] bf16 (slot [p][r] on
// rank q holds rank r's partial of a launch with parity p; the own slot stays unused).
//
// One launch, per block b (every rank launches the same grid G for the same call; block b of
// every rank handles the same elements):
//   1. E = epochs[b] + 1 is this launch's epoch, the same on every rank (all ranks have made the
//      same launches); parity E & 1 picks the receive slots.
//   2. Push: each thread loads its 16-byte vectors of this rank's partial and stores them into
//      every peer q's recv[parity][rank] (plain stores over NVLink).
//   3. Barrier: __syncthreads(); thread q (q != rank) stores E into flags_q[b][rank] with
//      st.release.sys; the block writes E into the epoch slots it owns (b, b+G, b+2G, ...);
//      thread q spins with ld.acquire.sys on its own flags[b][q] until it reads >= E (or, every
//      kAbortPollSpins spins, finds the workspace's host abort word set: a peer that never
//      comes must not hold this GPU forever); __syncthreads().
//   4. Reduce: each thread loads, for q = 0..world-1, rank q's vector (its own from the partial,
//      the others from its receive slots with ld.global.cg), sums in fp32 in that order and
//      writes the result (fused: the residual add and the norm).
//
// Why this is correct, also when a captured graph is replayed:
//   (a) The peers' data is visible after the barrier. Every thread's pushes precede, through
//       bar.sync, the release store of E that thread q of the pushing block makes; the receiving
//       thread's acquire load reads that store, and its block's bar.sync orders the data loads of
//       all its threads after the acquire. Release is cumulative in the PTX memory model, so the
//       loads see the pushes. Scope .sys: the two threads run on different GPUs. The data loads
//       bypass L1 (.cg) since other GPUs write the slots through L2, never through this SM.
//   (b) No rank overwrites a slot a peer still reads, with one barrier per launch instead of two
//       (double buffering). Launch K on rank r writes only recv_q[K & 1][r]; q reads that slot in
//       its launch K and next in K + 2, never in K + 1. Before r starts launch K + 2 its launch
//       K + 1 has completed, so some block of it read a flag that q stored in its launch >= K + 1,
//       which q can only run once its launch K has completed (one stream per rank, kernels in
//       order, no programmatic overlap). Hence q's reads of launch K precede r's stores of K + 2:
//       q's loads → q's release (K + 1) → r's acquire (K + 1) → kernel boundary → r's stores.
//   (c) Flags are compared with >=: a faster peer may already have stored E + 1 (it passed its
//       barrier E and started the next launch) before this block looked. Values only grow
//       (64 bits: no wrap). Slots of blocks absent from a launch (smaller grids) keep an older
//       epoch, < E, and are never waited on with it.
//   (d) The epoch needs no host update. Each launch advances every slot of its rank by exactly
//       one: block b writes the slots b, b+G, ... after its first bar.sync, by which time all its
//       threads have read slot b, and no other block of the launch reads them (block b' < G reads
//       only slot b'). The next launch on the stream sees the writes (kernel boundary). Replayed
//       graphs thus continue the sequence, and eager calls may interleave with replays.
//   (e) Progress: the grid never exceeds the SM count and a block always fits on an SM, so all
//       blocks of a launch are resident together and a spinning block never keeps the block a
//       peer waits for from running (unless other kernels occupy the GPU: run nothing else
//       that waits on a peer concurrently, e.g. NCCL on another stream).
#include <algorithm>
#include <atomic>

#include "kernels/allreduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kMaxWorld = kAllReduceMaxWorld;
constexpr int kMaxBlocks = kAllReduceMaxBlocks;
constexpr size_t kFlagBytes = sizeof(uint64_t) * kMaxBlocks * kMaxWorld;
constexpr size_t kEpochBytes = sizeof(uint64_t) * kMaxBlocks;
constexpr size_t kRecvOffset = CEIL_DIV(kFlagBytes + kEpochBytes, 256) * 256;
constexpr int kNormMaxThreads = 512, kNormMaxVecs = 4;
// Spins between two reads of the abort word: it lives in host memory (a PCIe round trip), and a
// healthy wait ends within a few hundred spins.
constexpr uint32_t kAbortPollSpins = 1024;
static_assert(kAllReduceMaxCols == kNormMaxThreads * kNormMaxVecs * 8);

// ---- system-scope flags (the peer runs on another GPU: .sys, not .gpu) ----

__device__ __forceinline__ void flag_store_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t flag_load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// ---- 16-byte vectors of 8 bf16 ----

__device__ __forceinline__ uint4 load_vec(const bf16* p) {
  return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

// Step 2: this rank's vector at element `e` into every peer's slot [parity][rank].
__device__ __forceinline__ void push_vec(const AllReduceRankView& v, size_t parity_base, size_t e,
                                         uint4 u) {
  const size_t off = parity_base + static_cast<size_t>(v.rank) * v.slot_elems + e;
#pragma unroll
  for (int q = 0; q < kMaxWorld; ++q)
    if (q < v.world && q != v.rank) *reinterpret_cast<uint4*>(v.recv[q] + off) = u;
}

// Step 4: acc = Σ_q rank q's vector at element `e`, fp32, in rank order (the same on every rank).
// All loads are issued before the first add.
__device__ __forceinline__ void reduce_vec(const AllReduceRankView& v, size_t parity_base, size_t e,
                                           uint4 own, float acc[8]) {
  const bf16* slots = v.recv[v.rank] + parity_base + e;
  uint4 u[kMaxWorld];
#pragma unroll
  for (int q = 0; q < kMaxWorld; ++q)
    if (q < v.world)
      u[q] = q == v.rank ? own
                         : __ldcg(reinterpret_cast<const uint4*>(slots + static_cast<size_t>(q) *
                                                                             v.slot_elems));
  unpack8(u[0], acc);
#pragma unroll
  for (int q = 1; q < kMaxWorld; ++q) {
    if (q < v.world) {
      float f[8];
      unpack8(u[q], f);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += f[j];
    }
  }
}

// Step 3 (see the file comment, (a)–(d)). Every thread of the block calls it once per launch.
__device__ __forceinline__ void exchange_barrier(const AllReduceRankView& v, uint64_t epoch) {
  __syncthreads();  // all pushes of the block issued; all threads have read epochs[blockIdx.x]
  const int t = threadIdx.x;
  const bool peer = t < v.world && t != v.rank;
  if (peer) flag_store_release(v.flags[t] + blockIdx.x * kMaxWorld + v.rank, epoch);
  for (int s = blockIdx.x + gridDim.x * t; s < kMaxBlocks; s += gridDim.x * blockDim.x)
    v.epochs[s] = epoch;
  if (peer) {
    uint32_t spins = 0;
    while (flag_load_acquire(v.flags[v.rank] + blockIdx.x * kMaxWorld + t) < epoch) {
      if (++spins % kAbortPollSpins == 0 && *v.abort) break;
    }
  }
  __syncthreads();
}

// Flat sum: the thread owning vector i (grid-stride) pushes it, then reduces it. The first
// vector's partial stays in a register across the barrier; later ones are reloaded (in may alias
// out: each element is read before its own thread writes it, and peers never read `in`).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    allreduce_sum_kernel(AllReduceRankView v, AllReduceParams p) {
  const uint64_t epoch = v.epochs[blockIdx.x] + 1;
  const size_t parity_base = (epoch & 1) * v.world * v.slot_elems;
  const size_t nvec = p.count / 8, stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  uint4 own_first = make_uint4(0, 0, 0, 0);
  for (size_t i = first; i < nvec; i += stride) {
    const uint4 u = load_vec(p.in + 8 * i);
    if (i == first) own_first = u;
    push_vec(v, parity_base, 8 * i, u);
  }
  exchange_barrier(v, epoch);
  for (size_t i = first; i < nvec; i += stride) {
    float acc[8];
    reduce_vec(v, parity_base, 8 * i, i == first ? own_first : load_vec(p.in + 8 * i), acc);
    store8(p.out + 8 * i, acc);
  }
}

// Fused: block b owns rows b, b+G, ...; thread t owns vectors t + k*kThreads (k < kVecs) of a
// row. The block's first row (its only one when rows <= G, all of decode up to 128 tokens) has
// its partial, residual and weight in registers before the barrier, so only the peers' data is
// awaited after it. Math and rounding as rmsnorm_kernel<true> (kernels/rmsnorm.cu) with
// in = bf16(Σ partials): r = bf16(residual + in), ss in fp32, out = r * rstd * (weight_offset +
// w).
template <int kThreads, int kVecs>
__global__ void __launch_bounds__(kThreads)
    allreduce_add_rmsnorm_kernel(AllReduceRankView v, RmsNormParams p) {
  __shared__ float scratch[32];
  const uint64_t epoch = v.epochs[blockIdx.x] + 1;
  const size_t parity_base = (epoch & 1) * v.world * v.slot_elems;
  const int nvec = p.cols / 8, row0 = blockIdx.x;  // grid <= rows: every block has a row
  uint4 own0[kVecs], res0[kVecs], w0[kVecs];
  for (int row = row0; row < p.rows; row += gridDim.x) {
    const size_t off = static_cast<size_t>(row) * p.cols;  // size_t: rows*cols overflows int
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < nvec) {
        const uint4 u = load_vec(p.in + off + 8 * i);
        if (row == row0) own0[k] = u;
        push_vec(v, parity_base, off + 8 * i, u);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i < nvec) {
      res0[k] = load_vec(p.residual + static_cast<size_t>(row0) * p.cols + 8 * i);
      w0[k] = load_vec(p.weight + 8 * i);
    }
  }
  exchange_barrier(v, epoch);
  for (int row = row0; row < p.rows; row += gridDim.x) {
    const size_t off = static_cast<size_t>(row) * p.cols;
    float r[kVecs][8];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < nvec) {
        float acc[8], x[8];
        reduce_vec(v, parity_base, off + 8 * i,
                   row == row0 ? own0[k] : load_vec(p.in + off + 8 * i), acc);
        unpack8(row == row0 ? res0[k] : load_vec(p.residual + off + 8 * i), x);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          r[k][j] = round_bf16(x[j] + round_bf16(acc[j]));
          ss += r[k][j] * r[k][j];
        }
        store8(p.residual + off + 8 * i, r[k]);
      }
    }
    ss = block_sum(ss, scratch);
    const float rstd = rsqrtf(ss / p.cols + p.eps);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < nvec) {
        float w[8];
        unpack8(w0[k], w);
#pragma unroll
        for (int j = 0; j < 8; ++j) r[k][j] = r[k][j] * rstd * (p.weight_offset + w[j]);
        store8(p.out + off + 8 * i, r[k]);
      }
    }
  }
}

const AllReduceRankView& rank_view(const AllReduceWorkspace& ws, int rank, const char* op) {
  MB_CHECK(rank >= 0 && rank < ws.world(),
           std::string(op) + ": rank outside the workspace's group");
  int device = -1;
  CUDA_CHECK(cudaGetDevice(&device));
  MB_CHECK(device == ws.device(rank), std::string(op) + ": the rank's device must be current");
  if (ws.aborted()) throw Error(std::string(op) + ": the all-reduce workspace was aborted");
  return ws.view(rank);
}

template <int kThreads, int kVecs>
void launch_add_rmsnorm(const AllReduceRankView& v, const RmsNormParams& p, cudaStream_t stream) {
  const int grid = std::min(p.rows, v.max_blocks);
  allreduce_add_rmsnorm_kernel<kThreads, kVecs><<<grid, kThreads, 0, stream>>>(v, p);
}

}  // namespace

// ---- workspace ----

size_t AllReduceWorkspace::bytes_per_device(int world, size_t max_bytes) {
  return kRecvOffset + 2 * static_cast<size_t>(world) * CEIL_DIV(max_bytes, 256) * 256;
}

AllReduceWorkspace::AllReduceWorkspace(const std::vector<int>& devices, size_t max_bytes)
    : devices_(devices), max_bytes_(max_bytes) {
  const int world = static_cast<int>(devices.size());
  MB_CHECK(world >= 2 && world <= kMaxWorld, "allreduce workspace: world size must be 2..8");
  MB_CHECK(max_bytes > 0, "allreduce workspace: max_bytes must be positive");
  for (int r = 0; r < world; ++r)
    for (int q = r + 1; q < world; ++q)
      MB_CHECK(devices[r] != devices[q], "allreduce workspace: each rank needs its own device");
  int prev = 0;
  CUDA_CHECK(cudaGetDevice(&prev));
  const size_t bytes = bytes_per_device(world, max_bytes);
  int max_blocks = kMaxBlocks;
  try {
    void* word = nullptr;
    CUDA_CHECK(cudaHostAlloc(&word, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    abort_ = static_cast<volatile uint32_t*>(word);
    *abort_ = 0;
    for (int r = 0; r < world; ++r) {
      CUDA_CHECK(cudaSetDevice(devices[r]));
      int sms = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, devices[r]));
      max_blocks = std::min(max_blocks, sms);
      for (int q = 0; q < world; ++q) {
        if (q == r) continue;
        int can = 0;
        CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[r], devices[q]));
        MB_CHECK(can, "allreduce workspace: device " + std::to_string(devices[r]) +
                          " cannot access device " + std::to_string(devices[q]) + " as a peer");
        const cudaError_t e = cudaDeviceEnablePeerAccess(devices[q], 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
          (void)cudaGetLastError();  // clear it: not a failure
        else
          CUDA_CHECK(e);
      }
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, bytes));
      allocs_.push_back(p);
      CUDA_CHECK(cudaMemset(p, 0, kRecvOffset));  // flags and epochs start at 0 (first epoch is 1)
      // cudaMemset runs on the legacy stream, which a non-blocking stream does not wait for.
      CUDA_CHECK(cudaDeviceSynchronize());
    }
  } catch (...) {
    release();
    cudaSetDevice(prev);
    throw;
  }
  CUDA_CHECK(cudaSetDevice(prev));
  const size_t slot_elems = CEIL_DIV(max_bytes, 256) * 256 / sizeof(bf16);
  views_.resize(world);
  for (int r = 0; r < world; ++r) {
    AllReduceRankView& v = views_[r];
    for (int q = 0; q < world; ++q) {
      char* base = static_cast<char*>(allocs_[q]);
      v.flags[q] = reinterpret_cast<uint64_t*>(base);
      v.recv[q] = reinterpret_cast<bf16*>(base + kRecvOffset);
    }
    v.epochs = reinterpret_cast<uint64_t*>(static_cast<char*>(allocs_[r]) + kFlagBytes);
    void* abort_dev = nullptr;  // the same address under unified addressing, asked for anyway
    CUDA_CHECK(cudaHostGetDevicePointer(&abort_dev, const_cast<uint32_t*>(abort_), 0));
    v.abort = static_cast<const volatile uint32_t*>(abort_dev);
    v.slot_elems = slot_elems;
    v.rank = r;
    v.world = world;
    v.max_blocks = max_blocks;
  }
}

AllReduceWorkspace::~AllReduceWorkspace() { release(); }

void AllReduceWorkspace::release() noexcept {
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  for (size_t r = 0; r < allocs_.size(); ++r) {
    if (cudaSetDevice(devices_[r]) == cudaSuccess) cudaFree(allocs_[r]);
  }
  allocs_.clear();
  if (abort_) cudaFreeHost(const_cast<uint32_t*>(abort_));
  abort_ = nullptr;
  if (prev >= 0) cudaSetDevice(prev);
}

void AllReduceWorkspace::abort() noexcept {
  *abort_ = 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// ---- ops ----

void allreduce_sum(const AllReduceWorkspace& ws, int rank, const AllReduceParams& p,
                   cudaStream_t stream) {
  const AllReduceRankView& v = rank_view(ws, rank, "allreduce_sum");
  MB_CHECK(p.count % 8 == 0, "allreduce_sum: count must be a multiple of 8");
  MB_CHECK(ws.fits(p.count * sizeof(bf16)),
           "allreduce_sum: message larger than the workspace's max_bytes");
  MB_CHECK(p.out && p.in, "allreduce_sum: null operand");
  MB_CHECK(aligned16(p.out) && aligned16(p.in), "allreduce_sum: operands must be 16-byte aligned");
  if (p.count == 0) return;  // every rank skips alike: no epoch is used
  const size_t nvec = p.count / 8;
  const auto grid = [&](int threads) {
    return static_cast<int>(
        std::min<size_t>(v.max_blocks, CEIL_DIV(nvec, static_cast<size_t>(threads))));
  };
  if (nvec <= 128)
    allreduce_sum_kernel<128><<<grid(128), 128, 0, stream>>>(v, p);
  else if (nvec <= 256)
    allreduce_sum_kernel<256><<<grid(256), 256, 0, stream>>>(v, p);
  else
    allreduce_sum_kernel<512><<<grid(512), 512, 0, stream>>>(v, p);
  CUDA_CHECK_LAST();
}

void allreduce_add_rmsnorm(const AllReduceWorkspace& ws, int rank, const RmsNormParams& p,
                           cudaStream_t stream) {
  const AllReduceRankView& v = rank_view(ws, rank, "allreduce_add_rmsnorm");
  MB_CHECK(p.cols > 0 && p.cols % 8 == 0,
           "allreduce_add_rmsnorm: cols must be a positive multiple of 8");
  MB_CHECK(p.cols <= kAllReduceMaxCols, "allreduce_add_rmsnorm: cols above kAllReduceMaxCols");
  MB_CHECK(p.rows >= 0, "allreduce_add_rmsnorm: rows must be >= 0");
  MB_CHECK(ws.fits(static_cast<size_t>(p.rows) * p.cols * sizeof(bf16)),
           "allreduce_add_rmsnorm: message larger than the workspace's max_bytes");
  MB_CHECK(p.out && p.in && p.residual && p.weight, "allreduce_add_rmsnorm: null operand");
  MB_CHECK(aligned16(p.out) && aligned16(p.in) && aligned16(p.residual) && aligned16(p.weight),
           "allreduce_add_rmsnorm: operands must be 16-byte aligned");
  MB_CHECK(p.out != p.residual, "allreduce_add_rmsnorm: out may alias in, not residual");
  if (p.rows == 0) return;
  const int nvec = p.cols / 8;
  if (nvec <= 128)
    launch_add_rmsnorm<128, 1>(v, p, stream);
  else if (nvec <= 256)
    launch_add_rmsnorm<256, 1>(v, p, stream);
  else if (nvec <= 512)
    launch_add_rmsnorm<512, 1>(v, p, stream);
  else if (nvec <= 1024)
    launch_add_rmsnorm<512, 2>(v, p, stream);
  else
    launch_add_rmsnorm<512, 4>(v, p, stream);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
