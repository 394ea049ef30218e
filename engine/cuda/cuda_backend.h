// The CUDA backend of the engine: weights loaded through the same plans as the CPU backend (bf16
// today), one rank per GPU (tensor parallel, driven by persistent rank threads and joined by an
// NCCL communicator the backend owns, under a collective watchdog; one GPU runs on the caller's
// thread), a paged KV pool sized by a memory plan per device, the forward of
// engine/cuda/forward.cpp, decode steps replayed from CUDA graphs captured per padded batch size,
// and sampling on the device so a step returns token ids instead of [rows, vocab] logits.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/cuda/memory_plan.h"
#include "engine/packed_weights.h"
#include "engine/weights.h"

namespace moebatch {

class CommWatchdog;
class CudaRank;
class RankThreads;
class StageTimer;

/// This build can join several GPUs (it was built with NCCL).
bool cuda_backend_has_nccl();

/// The largest all-reduce the peer-to-peer path carries (every decode batch of the shapes we
/// run and prefill chunks up to ~1k tokens at hidden 4096); larger ones go to NCCL. Its
/// workspace takes 2 × world × this per GPU. Measured against NCCL by size: bench/RESULTS.md.
constexpr size_t kCustomAllReduceMaxBytes = size_t{8} << 20;

/// Options of the CUDA backend.
struct CudaBackendOptions {
  /// CUDA ordinal of each tensor-parallel rank; empty: tensor_parallel_size consecutive devices
  /// from first_device.
  std::vector<int> devices;
  int tensor_parallel_size = 1;  ///< ranks when `devices` is empty
  int first_device = 0;          ///< ordinal of rank 0 when `devices` is empty
  /// MoE sharding across ranks: the intermediate dim of every expert, or whole experts (EP).
  ExpertSplit expert_split = ExpertSplit::Intermediate;
  /// Collectives among the ranks supplied by the caller (tests, a custom communicator; not
  /// owned, must outlive the backend; no watchdog). Null with more than one rank: the backend
  /// creates and owns a TpComm (NCCL + the peer-to-peer all-reduce; InputError in a build
  /// without NCCL). Ignored with one.
  Communicator* comm = nullptr;
  /// With the backend's own communicator: all-reduces up to this many bytes go through the
  /// in-process peer-to-peer all-reduce, fused with the residual add + RMSNorm after them
  /// (kernels/allreduce.cuh), larger ones through NCCL; 0: NCCL for every message (vLLM's
  /// --disable-custom-all-reduce).
  size_t custom_all_reduce_max_bytes = kCustomAllReduceMaxBytes;
  /// With the backend's own communicator: a step (or the start-up warm-up) running longer than
  /// this, or an asynchronous NCCL error, makes the watchdog abort the communicators; the step
  /// throws Error ("collective timeout after N s on rank R ...") and the backend stays failed
  /// until rebuilt. Generous: the longest legitimate step is a large prefill.
  double collective_timeout_s = 120.0;
  /// Test hook, with the backend's own communicator: this rank's thread stalls at the start of
  /// every step, before its first collective, until the watchdog aborts (a hung rank). -1: off.
  int debug_stall_rank = -1;
  double gpu_memory_utilization = 0.90;   ///< share of each GPU's memory this process may use
  int64_t block_size = 16;                ///< tokens per KV block
  int64_t max_num_seqs = 64;              ///< sampled rows per step; decode graphs up to this batch
  int64_t max_num_batched_tokens = 2048;  ///< tokens per forward call (longer steps are chunked)
  int64_t max_model_len = 0;              ///< longest sequence; 0: max_position_embeddings
  int64_t max_kv_cache_bytes = 0;  ///< cap on each device's KV pool; 0: everything the plan leaves
  bool cuda_graphs = true;         ///< replay decode steps from captured graphs
  /// Compressed linear weights: kept as the checkpoint stores them (auto), decoded (none), or
  /// plain ones quantized on load (fp8, nvfp4; for random models the only way to get them).
  Quantization quantization = Quantization::Auto;
  /// A non-decode step whose routed pairs average at least this many per local expert runs its
  /// experts as one tensor-core library GEMM each on gathered rows (prefill) instead of the
  /// grouped decode GEMM: tall operands pay for the per-expert launches and the host round trip
  /// of the offsets, short ones do not (bench/RESULTS.md). 0: never. Compressed experts need 2×
  /// this on the wgmma kernel, 4× on cuBLAS (their decode into bf16 is per expert, whatever the
  /// rows).
  int64_t moe_sorted_min_rows_per_expert = 64;
  /// That path's bf16 experts on the wgmma kernel (kernels/moe_wgmma.cuh) where the GPU is a
  /// Hopper and the build has its sm_90a code; false (or any other GPU): the cuBLAS grouped GEMM.
  bool wgmma_experts = true;
  /// There, FP8-block experts (groups of 128) run W8A8: the activations quantized per row and
  /// 128 columns, the products on FP8 tensor cores (kernels::moe_wgmma_fp8); so do the grouped
  /// GEMMs of steps with more than one token (kernels::moe_gemm's in_fp8). false: their weights
  /// are decoded to bf16 (a batch of experts at a time, or in registers) for bf16 products.
  bool w8a8_experts = true;
  /// One-row bf16 projections (batch-1 decode: qkv, o_proj, lm_head) on the persistent
  /// bulk-copy GEMV (kernels::gemv_stream) where the GPU is a Hopper and the build has its sm_90a
  /// code; false: the register-fed GEMV (kernels::gemv_quant).
  bool stream_gemv = true;
  /// The grouped expert GEMMs of decode steps with bf16 or W8A8 experts on the persistent
  /// TMA-fed wgmma kernel (kernels::moe_gemm_tma) where the GPU is a Hopper and the build has its
  /// sm_90a code; false: the register-pipelined kernels::moe_gemm.
  bool tma_experts = true;
  /// One-token decode steps of one rank run the MLP's residual add + RMSNorm inside the
  /// router's launch (kernels::RouteSmallNorm) instead of a launch of their own.
  bool router_norm = true;
  /// Prefill attention at head_dim 128 and 256 on the warpgroup-MMA kernel
  /// (kernels/attention_wgmma.cu) where the GPU is a Hopper and the build has its sm_90a code;
  /// false: the mma.sync kernel (head_dim 256: the CUDA-core kernel).
  bool wgmma_attention = true;
  /// Decode steps' q/k norm, rotation and cache write inside the decode attention kernel
  /// (kernels::AttentionParams::fused_rope, where attention_decode_fuses_rope allows it: the
  /// warp kernel of large batches) instead of a qk_norm_rope launch before it.
  bool fused_rope_attention = true;
  /// Prefill steps' q norm + rotation inside the prefill attention (kernels::AttentionParams::
  /// rope_q: the persistent wgmma kernel rotates each row tile's Q as it lands), the qk_norm_rope
  /// launch before it left with the k heads and the cache write; false: q in that launch too.
  bool prefill_rope_q = true;
  /// Decode steps' split attention (2..8 splits, a GPU with clusters) merges its splits through
  /// a thread block cluster's shared memory instead of the workspace and a ticket
  /// (kernels::AttentionParams::cluster_merge; the same bits). Batch 1 3.17-3.18 → 3.08 ms (H100,
  /// 30B shape, 2026-12-06); batch 256 unchanged (the warp kernel, no splits).
  bool cluster_attention_merge = true;
  /// Decode steps' router (kernels::moe_route_small, ≤ 8 tokens) as one thread block cluster of
  /// 16 blocks whose logits meet in the first block's shared memory, instead of 32 blocks that
  /// store them, fence, take tickets and let the last block reload them; GPUs that cannot launch
  /// the cluster take the ticket form (kernels::moe_route_small_prepare_cluster).
  bool cluster_router = true;
  /// The decode step's gemv_stream projections, q/k norm + rope, decode attention and one-launch
  /// router let the next kernel launch at their start instead of after their wait
  /// (kernels/launch.cuh, pdl_trigger_early), so its blocks are resident and through their
  /// preamble when this one ends. H100, 30B shape: batch 1 2.972–2.975 → 2.955–2.958 ms (the
  /// same call, in turn), batch 256 unchanged; bitwise the same outputs.
  bool pdl_trigger_early = true;
  /// One-token steps of one rank form the pending MoE combine + residual add + attention norm
  /// inside the qkv GEMV (kernels::gemv_stream_combine_norm) instead of a one-block launch before
  /// it. An experiment (session 19, written without a GPU run), off until measured faster.
  bool combine_norm_in_qkv = false;
  /// Decode steps' expert GEMVs on 4-bit weights (NVFP4, GGUF's Q4_K as Int4) on tensor cores
  /// (kernels/gemv_mma_device.cuh) instead of decoded into CUDA-core FMAs (Int4 steps −5% at
  /// batch 1, NVFP4 the same; bench/RESULTS.md, session 20).
  bool mma_expert_gemv = true;
  /// Keys each split of a decode step's split-K attention takes at least (the split count is
  /// bounded by the context bucket over this): more keys a split, fewer partials to merge. At
  /// batch 1 (context bucket 256) 64–256 measured slower than 32 (bench/RESULTS.md, session 20).
  int64_t decode_attention_min_split_keys = 32;
  /// One-token steps of one rank: where the next layer's qkv GEMV is gemv_stream (bf16), the
  /// down expert GEMV forms the MoE combine and the residual add itself
  /// (kernels::moe_gemv_combine, a block over the same output rows of every pair) and the qkv
  /// GEMV the norm from the residual alone (a 4 KB row a CTA): one launch less a layer, bf16
  /// batch 1 −3.4% (bench/RESULTS.md, session 23). The down GEMV is then on the CUDA-core walk
  /// whatever its codec.
  bool combine_in_down = true;
  /// Projections on FP8-block weights (128 × 128 scale blocks) of steps with more than 8 rows as
  /// W8A8 on cuBLASLt's block-scaled FP8 GEMM (kernels/gemm_fp8.cuh), the rows quantized per
  /// 1 × 128 as vLLM does for block-FP8 checkpoints, where the GPU is a Hopper and the shape is
  /// one where it measured faster (engine/cuda/linear.cpp); false: the weights decoded to bf16
  /// for a bf16 cuBLAS GEMM.
  bool w8a8_linear = true;

  /// The ordinal of every rank (`devices`, or the consecutive range).
  std::vector<int> device_list() const;
};

/// The model on one or more GPUs. Not thread-safe (one step at a time, as every Backend).
class CudaBackend final : public Backend {
 public:
  /// Loads `model_dir` (config.json + safetensors) onto the GPUs. InputError on a bad
  /// checkpoint, bad options, or when the memory plan does not fit (the message names the
  /// numbers).
  CudaBackend(const std::filesystem::path& model_dir, const CudaBackendOptions& opts);
  /// A model of config `cfg` with seeded random weights generated on the GPUs (benchmarks).
  CudaBackend(const ModelConfig& cfg, uint64_t seed, const CudaBackendOptions& opts);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  const BackendInfo& info() const override { return info_; }
  void forward(const StepBatch& batch, std::vector<float>& logits) override;
  /// Samples on the device and copies back one id per row; with `logits` set it runs
  /// forward() and samples on the host instead (the base class).
  void forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                      std::vector<int32_t>& tokens, std::vector<float>* logits) override;

  /// Rank `rank`'s memory plan.
  const MemoryPlan& memory_plan(int rank = 0) const;
  /// Turns decode-graph replay on or off (off: the same launches run eagerly).
  void set_cuda_graphs(bool on) { opts_.cuda_graphs = on; }
  /// Sets CudaBackendOptions::debug_stall_rank between steps (tests: healthy steps first, then
  /// a stuck rank). InputError without the backend's own communicator or out of range.
  void set_debug_stall_rank(int rank);
  /// Decode graphs rank 0 captured so far.
  size_t num_graphs() const;
  /// Runs `batch` once eagerly with events between stages on rank 0 and returns milliseconds
  /// per stage (summed over layers), in first-seen order.
  std::vector<std::pair<std::string, double>> profile(const StepBatch& batch);

 private:
  void init(const std::filesystem::path* model_dir, uint64_t seed);
  void check_options() const;
  void fill_info();
  // Creates and owns the TpComm and its watchdog (world > 1 without options.comm).
  void make_communicator();
  // All-reduces and all-gathers of 1, 8, 64, ... rows on every rank, under the watchdog, so NCCL
  // connects its channels at start-up (see the .cpp).
  void warm_up_communicator();
  // Runs the whole batch on every rank; for each group of logits rows rank 0 calls
  // on_rows(rank0, out_rows, count) with its buf.logits holding those rows' logits.
  template <class OnRows>
  void run(const StepBatch& b, OnRows&& on_rows);
  // fn(rank) on every rank's thread, under the watchdog when there is one: a rank that throws
  // trips it (peers blocked in a collective are released), and a timeout or NCCL error becomes
  // this call's Error.
  template <class F>
  void run_ranks(F&& fn);
  // Error with the watchdog's reason once it has fired (the communicators are then aborted).
  void throw_if_aborted() const;
  // The debug_stall_rank hook on that rank's thread.
  void stall(int rank) const;

  ModelConfig cfg_;
  CudaBackendOptions opts_;
  std::vector<int> devices_;
  int64_t max_model_len_ = 0;
  int64_t kv_blocks_ = 0;
  size_t p2p_max_bytes_ = 0;  // the peer-to-peer all-reduce's capacity (0: NCCL only)
  std::string weight_groups_;  // "attention fp8, experts fp8" (describe_weight_groups)
  BackendInfo info_;
  StateSlotTracker state_slots_;  // where each recurrent-state slot's sequence ended
  // Destruction runs bottom up: rank threads stop, then the ranks release their graphs, streams
  // and memory, then the watchdog joins, then the communicator goes. NCCL releases a communicator
  // only after every graph that captured its collectives is destroyed (an abort in progress on
  // the watchdog's thread finishes when the ranks go), so this order is required.
  std::unique_ptr<Communicator> own_comm_;  // the TpComm this backend created
  Communicator* comm_ = nullptr;            // the ranks' communicator: own_comm_ or options.comm
  std::unique_ptr<CommWatchdog> watchdog_;  // watches own_comm_ (none with options.comm)
  std::vector<std::unique_ptr<CudaRank>> ranks_;
  std::unique_ptr<RankThreads> threads_;
  StageTimer* timer_ = nullptr;  // set only inside profile(); rank 0 records into it
};

}  // namespace moebatch
