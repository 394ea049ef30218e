// CudaBackend: start-up (options, shards, a memory plan per device, the NCCL communicator and
// its watchdog, ranks built on their threads), a step (validated and cut into chunks once on the
// calling thread, then run by every rank under the watchdog), device sampling on rank 0, and the
// info the engine and service read. The model math is engine/cuda/forward.cpp; a rank's
// resources are engine/cuda/cuda_rank.cpp.
#include "engine/cuda/cuda_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "common/error.h"
#include "engine/model_files.h"
#include "engine/packed_weights.h"
#include "engine/cuda/comm_watchdog.h"
#include "engine/cuda/cuda_rank.h"
#include "engine/cuda/device_memory.h"
#include "engine/cuda/forward.h"
#include "engine/cuda/linear.h"
#include "engine/cuda/rank_threads.h"
#include "engine/cuda/stage_timer.h"
#include "engine/cuda/step_chunk.h"
#include "kernels/gemm_fp8.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/allreduce.cuh"
#ifdef MOEBATCH_HAVE_NCCL
#include "engine/cuda/tp_comm.h"
#endif

namespace moebatch {
namespace {

// Graph executables, the CUDA context's own growth and allocator slack.
constexpr size_t kReserve = 512u << 20;
// NCCL's channel buffers and its share of captured graphs (only with more than one rank).
constexpr size_t kCommReserve = 1u << 30;

std::string device_name(int ordinal) { return "cuda:" + std::to_string(ordinal); }

}  // namespace

bool cuda_backend_has_nccl() {
#ifdef MOEBATCH_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::vector<int> CudaBackendOptions::device_list() const {
  if (!devices.empty()) return devices;
  std::vector<int> out;
  for (int i = 0; i < tensor_parallel_size; ++i) out.push_back(first_device + i);
  return out;
}

CudaBackend::CudaBackend(const std::filesystem::path& model_dir, const CudaBackendOptions& opts)
    : cfg_(load_any_model_config(model_dir)), opts_(opts) {
  init(&model_dir, 0);
}

CudaBackend::CudaBackend(const ModelConfig& cfg, uint64_t seed, const CudaBackendOptions& opts)
    : cfg_(cfg), opts_(opts) {
  init(nullptr, seed);
}

CudaBackend::~CudaBackend() = default;

void CudaBackend::check_options() const {
  const CudaBackendOptions& o = opts_;
  const int world = static_cast<int>(devices_.size());
  if (world < 1 || world > 64)
    throw InputError("cuda backend: tensor_parallel_size must be in [1, 64], got " +
                     std::to_string(world));
  if (o.moe_sorted_min_rows_per_expert < 0)
    throw InputError("cuda backend: moe_sorted_min_rows_per_expert must be >= 0");
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i] < 0) throw InputError("cuda backend: negative device ordinal");
    if (std::find(devices_.begin(), devices_.begin() + i, devices_[i]) != devices_.begin() + i)
      throw InputError("cuda backend: device " + std::to_string(devices_[i]) + " listed twice");
  }
  if (world > 1) {
    if (!o.comm && !cuda_backend_has_nccl())
      throw InputError(fmt::format(
          "tensor parallelism on the CUDA backend ({} GPUs) needs NCCL, and this build has none "
          "(configure with NCCL >= 2.18 installed: -DMOEBATCH_NCCL=ON, NCCL_HOME)",
          world));
    if (o.comm && o.comm->world() != world)
      throw InputError(fmt::format("cuda backend: {} devices but the communicator joins {} ranks",
                                   world, o.comm->world()));
  }
  if (!(o.collective_timeout_s > 0))
    throw InputError("cuda backend: collective_timeout must be positive");
  if (o.debug_stall_rank != -1 &&
      (world == 1 || o.comm || o.debug_stall_rank < 0 || o.debug_stall_rank >= world))
    throw InputError(
        "cuda backend: debug_stall_rank needs the backend's own communicator and a "
        "rank in [0, tensor_parallel_size)");
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
    throw InputError("gpu_memory_utilization must be in (0, 1]");
  if (o.block_size < 1 || o.block_size > 1024)
    throw InputError("KV block size must be in [1, 1024]");
  if (o.max_num_seqs < 1 || o.max_num_batched_tokens < o.max_num_seqs ||
      o.max_num_batched_tokens > 65535)
    throw InputError("cuda backend: need 1 <= max_num_seqs <= max_num_batched_tokens <= 65535");
  const int64_t hd = cfg_.head_dim;
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256)
    throw InputError("cuda backend: head_dim must be 16, 32, 64, 128 or 256, got " +
                     std::to_string(hd));
  if (cfg_.hidden_size % 32 != 0)
    throw InputError("cuda backend: hidden_size must be a multiple of 32");
  MB_CHECK(static_cast<int64_t>(cfg_.layers.size()) == cfg_.num_layers,
           "model config: one LayerKind per layer (default_layer_kinds for hand-built configs)");
  if (cfg_.num_linear_layers() > 0) {
    // Gated DeltaNet kernels (kernels/linear_attention.cuh) and the rotary / norm variants of
    // Qwen3-Next's full-attention layers
    const LinearAttentionDims& a = cfg_.linear;
    if (a.k_head_dim != 32 && a.k_head_dim != 64 && a.k_head_dim != 128)
      throw InputError("cuda backend: linear_key_head_dim must be 32, 64 or 128");
    if (a.v_head_dim % 32 != 0 || a.v_head_dim > 256)
      throw InputError("cuda backend: linear_value_head_dim must be a multiple of 32, <= 256");
    if (a.conv_kernel < 2 || a.conv_kernel > 8)
      throw InputError("cuda backend: linear_conv_kernel_dim must be in [2, 8]");
  }
}

void CudaBackend::init(const std::filesystem::path* model_dir, uint64_t seed) {
  const CudaBackendOptions& o = opts_;
  devices_ = o.device_list();
  check_options();
  const int world = static_cast<int>(devices_.size());
  max_model_len_ = o.max_model_len > 0 ? std::min(o.max_model_len, cfg_.max_position_embeddings)
                                       : cfg_.max_position_embeddings;

  // Shards and their weight plans (host only; shard_dims checks divisibility).
  std::vector<ModelPlan> wplans;
  for (int r = 0; r < world; ++r) {
    ShardSpec spec;
    spec.rank = r;
    spec.world = world;
    spec.expert_split = o.expert_split;
    ranks_.push_back(std::make_unique<CudaRank>(cfg_, spec, devices_[r], nullptr));
    if (cfg_.num_experts > 0 && ranks_.back()->dims.moe_intermediate % 32 != 0)
      throw InputError(
          "cuda backend: moe_intermediate_size / tensor_parallel_size must be a "
          "multiple of 32");
    wplans.push_back(plan_weights(cfg_, spec));
  }
  std::unique_ptr<WeightSource> ckpt;  // a checkpoint directory or a GGUF file
  if (model_dir) ckpt = open_model_files(*model_dir).weights;  // header errors before allocating
  // Which linear weights stay (or become) compressed; scale and shard errors before allocating.
  for (ModelPlan& wp : wplans) {
    assign_weight_formats(wp, cfg_, ckpt.get(), o.quantization);
    if (ckpt) check_weight_plan(*ckpt, cfg_, wp);  // every tensor, before any device memory
  }
  weight_groups_ = describe_weight_groups(wplans[0]);

  int count = 0;
  const cudaError_t derr = cudaGetDeviceCount(&count);
  for (int d : devices_) {
    if (derr != cudaSuccess || d >= count) {
      throw InputError(fmt::format("CUDA backend not available: device {} requested, {} found ({})",
                                   d, derr == cudaSuccess ? count : 0, cudaGetErrorString(derr)));
    }
  }
  for (int r = 0; r < world; ++r) {
    ranks_[r]->wgmma_experts = o.wgmma_experts && kernels::moe_wgmma_available(devices_[r]);
    ranks_[r]->w8a8_experts = ranks_[r]->wgmma_experts && o.w8a8_experts;
    ranks_[r]->stream_gemv = o.stream_gemv && kernels::gemv_stream_available(devices_[r]);
    ranks_[r]->tma_experts = o.tma_experts && kernels::moe_gemm_tma_available(devices_[r]);
    ranks_[r]->router_norm = o.router_norm;
    ranks_[r]->wgmma_attention = o.wgmma_attention;
    ranks_[r]->fused_rope_attention = o.fused_rope_attention;
    ranks_[r]->prefill_rope_q = o.prefill_rope_q;
    ranks_[r]->cluster_attention_merge = o.cluster_attention_merge;
    ranks_[r]->cluster_router = o.cluster_router;
    ranks_[r]->pdl_trigger_early = o.pdl_trigger_early;
    ranks_[r]->combine_norm_in_qkv = o.combine_norm_in_qkv;
    ranks_[r]->mma_expert_gemv = o.mma_expert_gemv;
    ranks_[r]->combine_in_down = o.combine_in_down;
    ranks_[r]->w8a8_linear = o.w8a8_linear && kernels::fp8_block_gemm_available(devices_[r]);
  }
  // The sorted prefill path decodes every compressed expert into bf16 before its GEMM, a cost
  // that rows must amortize. On cuBLAS (no wgmma): at 160 rows per expert (Qwen3-Next-80B FP8,
  // 64 × 128 tokens) the grouped kernel, which decodes in registers, was 1.2× faster, at 512 (30B
  // FP8) the sorted path 1.7×: 4× the rows. On wgmma the sorted path won at 160 rows too (20.0k
  // → 25.6k tok/s): 2× (bench/RESULTS.md 2026-12-01). W8A8 experts decode nothing: 1×.
  for (int r = 0; r < world; ++r) {
    bool packed = false;
    for (const auto& L : wplans[r].layers) {
      const bool w8a8 = ranks_[r]->w8a8_experts && w8a8_experts(L.w_gate_up, L.w_down);
      packed |= !L.w_gate_up.empty() && L.w_gate_up.format != WeightFormat::Bf16 && !w8a8;
    }
    const int64_t packed_factor = ranks_[r]->wgmma_experts ? 2 : 4;
    ranks_[r]->sorted_moe_min_rows = o.moe_sorted_min_rows_per_expert * (packed ? packed_factor : 1);
  }
  threads_ = std::make_unique<RankThreads>(world);
  std::vector<size_t> total(world), free(world);
  threads_->run_all([&](int r) { ranks_[r]->probe(total[r], free[r]); });

  StepCapacity cap;
  cap.tokens = o.max_num_batched_tokens;
  cap.logits_rows = o.max_num_seqs;
  cap.table_width = (max_model_len_ + o.block_size - 1) / o.block_size;
  cap.attn_splits = kMaxAttnSplits;
  // The peer-to-peer all-reduce (backend's own communicator only): messages up to the cap, or
  // up to a whole step's [tokens, hidden] when that is smaller.
  const size_t step_bytes = static_cast<size_t>(cap.tokens) * cfg_.hidden_size * sizeof(bf16);
  p2p_max_bytes_ = world > 1 && !o.comm && cfg_.hidden_size <= kernels::kAllReduceMaxCols &&
                           world <= kernels::kAllReduceMaxWorld
                       ? std::min(o.custom_all_reduce_max_bytes, step_bytes)
                       : 0;
  const size_t p2p_bytes =
      p2p_max_bytes_ ? kernels::AllReduceWorkspace::bytes_per_device(world, p2p_max_bytes_) : 0;
  std::vector<DeviceNeeds> needs(world);
  std::string names;
  for (int r = 0; r < world; ++r) {
    const ShardDims& d = ranks_[r]->dims;
    const WeightArena arena = weight_arena(cfg_, d, wplans[r]);
    DeviceNeeds& n = needs[r];
    n.device = device_name(devices_[r]);
    n.total = total[r];
    n.free = free[r];
    n.weights = arena.bytes;
    n.weight_formats = arena.formats;
    n.activations = step_buffer_bytes(cfg_, d, cap) + dequant_scratch_elems(wplans[r]) * sizeof(bf16) +
                    (ranks_[r]->w8a8_linear ? w8a8_linear_bytes(wplans[r], cap.tokens) : 0);
    n.state = DeviceLinearState::bytes(cfg_, d, o.max_num_seqs);
    n.reserve = kReserve + kCublasWorkspace + (world > 1 ? kCommReserve + p2p_bytes : 0);
    n.kv_block_bytes = static_cast<size_t>(cfg_.num_kv_layers()) * 2 * o.block_size *
                       d.num_kv_heads * cfg_.head_dim * sizeof(bf16);
    names += (r ? "," : "") + n.device;
  }
  spdlog::info("cuda backend: {} ({} layers, {} experts) on {}", arch_name(cfg_.arch),
               cfg_.num_layers, cfg_.num_experts, names);
  MemoryLimits lim;
  lim.gpu_memory_utilization = o.gpu_memory_utilization;
  lim.max_kv_cache_bytes = o.max_kv_cache_bytes;
  lim.max_model_len = max_model_len_;
  lim.block_size = o.block_size;
  const std::vector<MemoryPlan> plans = plan_device_memory(needs, lim);
  kv_blocks_ = plans[0].kv_blocks;
  if (world > 1) {
    if (o.comm) {
      comm_ = o.comm;
    } else {
      make_communicator();  // its buffers come out of the plan's communicator reserve
    }
    for (auto& r : ranks_) r->comm = comm_;
#ifdef MOEBATCH_HAVE_NCCL
    if (own_comm_)
      for (auto& r : ranks_) r->p2p = static_cast<TpComm&>(*own_comm_).p2p();
#endif
  }
  threads_->run_all([&](int r) {
    ranks_[r]->build(cfg_, wplans[r], plans[r], cap, o.block_size, ckpt.get(), seed);
  });
  if (watchdog_) warm_up_communicator();
  fill_info();
}

void CudaBackend::make_communicator() {
#ifdef MOEBATCH_HAVE_NCCL
  auto tp = std::make_unique<TpComm>(devices_, p2p_max_bytes_);
  TpComm& c = *tp;
  comm_ = tp.get();
  own_comm_ = std::move(tp);
  watchdog_ = std::make_unique<CommWatchdog>(c, static_cast<int>(devices_.size()),
                                             opts_.collective_timeout_s);
#else
  throw InputError("tensor parallelism on the CUDA backend needs NCCL, and this build has none");
#endif
}

// NCCL connects a rank's channels lazily, at its first collective of each algorithm: a host-side
// exchange with every peer. Doing that here, under the watchdog, keeps it out of the steps (where
// a stalled peer would hold a rank inside NCCL's host code) and out of graph capture, and a peer
// that cannot be reached fails start-up with a timeout instead of hanging it. Every row count
// 1, 8, 64, ... up to the capacity, so whatever NCCL picks for decode and prefill sizes is
// connected (the small ones exercise the peer-to-peer path instead). Contents are zeros.
void CudaBackend::warm_up_communicator() {
  auto row_counts = [](size_t cap) {
    std::vector<size_t> rows;
    for (size_t n = 1; n < cap; n *= 8) rows.push_back(n);
    rows.push_back(cap);
    return rows;
  };
  run_ranks([&](int rank) {
    CudaRank& r = *ranks_[rank];
    r.activate();
    const StepBuffers& B = r.buf;
    const size_t H = static_cast<size_t>(cfg_.hidden_size), T = static_cast<size_t>(B.cap.tokens);
    CUDA_CHECK(cudaMemsetAsync(B.o, 0, T * H * sizeof(bf16), r.stream));
    for (size_t n : row_counts(T))
      comm_->all_reduce_sum(rank, B.o, n * H, CommDType::Bf16, r.stream);
    if (r.dims.vocab_split) {
      const size_t Vl = static_cast<size_t>(r.dims.vocab);
      const size_t R = static_cast<size_t>(B.cap.logits_rows);
      CUDA_CHECK(cudaMemsetAsync(B.logits_local, 0, R * Vl * sizeof(float), r.stream));
      for (size_t n : row_counts(R))
        comm_->all_gather(rank, B.logits_local, B.logits_gather, n * Vl, CommDType::F32, r.stream);
    }
    CUDA_CHECK(cudaStreamSynchronize(r.stream));
  });
}

void CudaBackend::set_debug_stall_rank(int rank) {
  const int world = static_cast<int>(ranks_.size());
  if (rank != -1 && (!watchdog_ || rank < 0 || rank >= world))
    throw InputError(
        "cuda backend: debug_stall_rank needs the backend's own communicator and a "
        "rank in [0, tensor_parallel_size)");
  opts_.debug_stall_rank = rank;
}

// The watchdog's verdict, not the communicator's flag: it is set before the abort starts, so a
// step right after a failed one cannot slip in while ncclCommAbort is still running.
void CudaBackend::throw_if_aborted() const {
  if (!watchdog_) return;
  std::string why = watchdog_->abort_reason();
  if (!why.empty()) throw Error(why);
}

// A hung rank: no launches, no collectives, until the watchdog aborts the communicators. The cap
// turns a watchdog that never fires into a failed test (the step then runs normally) instead of
// a hung one.
void CudaBackend::stall(int rank) const {
  using Clock = std::chrono::steady_clock;
  const auto cap = std::chrono::duration<double>(4 * opts_.collective_timeout_s + 10);
  const Clock::time_point t0 = Clock::now();
  spdlog::warn("cuda backend: debug_stall_rank: rank {} stalls", rank);
  while (!watchdog_->fired() && Clock::now() - t0 < cap)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  throw_if_aborted();
}

template <class F>
void CudaBackend::run_ranks(F&& fn) {
  if (!watchdog_) {
    threads_->run_all(fn);
    return;
  }
  watchdog_->begin_step();
  std::exception_ptr err;
  try {
    threads_->run_all([&](int rank) {
      try {
        fn(rank);
      } catch (const std::exception& e) {
        watchdog_->trip(rank, e.what());
        throw;
      } catch (...) {
        watchdog_->trip(rank, "unknown exception");
        throw;
      }
    });
  } catch (...) {
    err = std::current_exception();
  }
  // The watchdog's own finding names the cause (the ranks' errors are its consequences).
  const std::string failure = watchdog_->end_step();
  if (!failure.empty()) throw Error(failure);
  if (err) std::rethrow_exception(err);
}

void CudaBackend::fill_info() {
  const int world = static_cast<int>(ranks_.size());
  std::string names, formats;
  info_.kv_bytes_per_token = 0;
  info_.devices.clear();
  for (const auto& r : ranks_) {
    const MemoryPlan& p = r->plan;
    names += (names.empty() ? "" : ",") + p.device;
    for (const auto& [f, bytes] : p.weight_formats) {
      const std::string name = weight_format_name(f);
      if (formats.find(name) == std::string::npos) formats += (formats.empty() ? "" : "+") + name;
    }
    info_.kv_bytes_per_token += cfg_.num_kv_layers() * 2 * r->dims.num_kv_heads * cfg_.head_dim *
                                static_cast<int64_t>(sizeof(bf16));
    DeviceUsage u;
    u.device = p.device;
    u.weight_bytes = static_cast<int64_t>(p.weights);
    u.kv_bytes = static_cast<int64_t>(p.kv);
    u.state_bytes = static_cast<int64_t>(p.state);
    u.activation_bytes = static_cast<int64_t>(p.activations);
    u.total_bytes = static_cast<int64_t>(p.total);
    info_.devices.push_back(u);
  }
  const bool ep = world > 1 && cfg_.num_experts > 0 && opts_.expert_split == ExpertSplit::Expert;
  info_.description = fmt::format("cuda tp={}{} on {}, {} weights ({})", world,
                                  ep ? " (expert parallel)" : "", names, formats, weight_groups_);
  info_.kv_blocks = kv_blocks_;
  info_.block_size = opts_.block_size;
  info_.state_slots = cfg_.state_bytes_per_seq() > 0 ? opts_.max_num_seqs : 0;
  info_.max_model_len = max_model_len_;
  if (info_.state_slots > 0) state_slots_ = StateSlotTracker(info_.state_slots);
}

const MemoryPlan& CudaBackend::memory_plan(int rank) const { return ranks_.at(rank)->plan; }

size_t CudaBackend::num_graphs() const { return ranks_[0]->num_graphs(); }

template <class OnRows>
void CudaBackend::run(const StepBatch& b, OnRows&& on_rows) {
  // A backend whose communicators were aborted stays failed: the engine must be rebuilt.
  throw_if_aborted();
  // Everything that can reject the batch happens here, before any rank starts: a rank that
  // failed mid-step would leave the others waiting inside a collective (until the watchdog).
  validate_step_batch(b, cfg_, kv_blocks_, opts_.block_size, max_model_len_);
  // Recurrent state: the kernels start a sequence at position 0 from zero and continue any
  // other run from its slot, so the slots only need the host-side ownership check.
  if (info_.state_slots > 0) state_slots_.advance(b);
  const CudaRank& first = *ranks_[0];
  ChunkLimits lim;
  lim.tokens = static_cast<int>(first.buf.cap.tokens);
  lim.max_num_seqs = static_cast<int>(opts_.max_num_seqs);
  lim.block_size = static_cast<int>(opts_.block_size);
  lim.scratch_block = static_cast<int>(kv_blocks_);
  lim.table_cap = static_cast<int>((max_model_len_ + opts_.block_size - 1) / opts_.block_size);
  lim.num_kv_heads = static_cast<int>(first.dims.num_kv_heads);
  lim.num_sms = first.num_sms;
  lim.min_split_keys = static_cast<int>(std::clamp<int64_t>(opts_.decode_attention_min_split_keys, 1, 1 << 20));
  const std::vector<StepChunk> chunks = prepare_chunks(b, lim);
  const bool graphs = opts_.cuda_graphs && !timer_;
  const int R = static_cast<int>(first.buf.cap.logits_rows);

  const int stall_rank = opts_.debug_stall_rank;

  run_ranks([&](int rank) {
    CudaRank& r = *ranks_[rank];
    r.activate();
    if (rank == stall_rank) stall(rank);
    StageTimer* tm = rank == 0 ? timer_ : nullptr;
    for (const StepChunk& c : chunks) {
      // Graph replays bypass the communicator's own check: never launch one after an abort.
      throw_if_aborted();
      r.upload(c);
      const int real = static_cast<int>(c.out_rows.size());
      if (c.decode_graph) {
        r.run_decode(cfg_, c, graphs, tm);
        if (watchdog_) watchdog_->progress(rank);
        if (rank == 0) on_rows(r, c.out_rows.data(), real);
        continue;
      }
      cuda_forward(cfg_, r, c.shape, tm);
      if (watchdog_) watchdog_->progress(rank);
      for (int r0 = 0; r0 < real; r0 += R) {
        const int cnt = std::min(R, real - r0);
        cuda_lm_head(cfg_, r, r0, cnt, c.shape.tokens, tm);
        if (rank == 0) on_rows(r, c.out_rows.data() + r0, cnt);
      }
    }
  });
}

void CudaBackend::forward(const StepBatch& batch, std::vector<float>& logits) {
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  logits.resize(batch.logits_rows.size() * V);
  std::vector<float> rows_host;
  run(batch, [&](CudaRank& r, const int32_t* out_rows, int count) {
    rows_host.resize(static_cast<size_t>(count) * V);
    r.download_logits(rows_host.data(), count, cfg_.vocab_size);
    for (int i = 0; i < count; ++i)
      std::copy_n(rows_host.data() + i * V, V,
                  logits.data() + static_cast<size_t>(out_rows[i]) * V);
  });
}

void CudaBackend::forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                                 std::vector<int32_t>& tokens, std::vector<float>* logits) {
  if (logits) {
    // The caller keeps the logits: copy them back and sample on the host.
    Backend::forward_sample(batch, rows, tokens, logits);
    return;
  }
  MB_CHECK(rows.size() == batch.logits_rows.size(), "one sampling row per logits row");
  tokens.assign(rows.size(), 0);
  run(batch, [&](CudaRank& r, const int32_t* out_rows, int count) {
    r.sample(rows, out_rows, count, cfg_.vocab_size, tokens);
  });
}

std::vector<std::pair<std::string, double>> CudaBackend::profile(const StepBatch& batch) {
  StageTimer timer;
  timer_ = &timer;
  try {
    run(batch, [&](CudaRank&, const int32_t*, int) {});
  } catch (...) {
    timer_ = nullptr;
    throw;
  }
  timer_ = nullptr;
  timer.collect();
  return timer.totals();
}

}  // namespace moebatch
