// CudaBackend: start-up (memory plan, weights, KV pool, buffers), batch preparation (runs of
// consecutive positions become attention sequences; long steps are cut into chunks of the token
// capacity), decode graphs, and device sampling. The model math is engine/cuda/forward.cpp.
#include "engine/cuda/cuda_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "engine/cuda/device_memory.h"
#include "engine/safetensors.h"
#include "kernels/cuda_check.cuh"
#include "kernels/sampling.cuh"

namespace moebatch {
namespace {

constexpr size_t kCublasWorkspace = 32u << 20;
// cuBLAS workspace, graph executables, the CUDA context's own growth and allocator slack.
constexpr size_t kReserve = 512u << 20;
// Most split-K partitions of decode attention (sizes the workspace).
constexpr int kMaxAttnSplits = 16;

double gib(size_t b) { return static_cast<double>(b) / (1u << 30); }

int next_pow2(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

/// One forward call's host-side inputs and shape.
struct CudaBackend::Chunk {
  std::vector<int32_t> tokens, positions, slots, q_start, kv_lens, tables, logits_rows;
  std::vector<int32_t> out_rows;  // output row of each logits row
  StepShape shape;
  bool decode_graph = false;  // padded decode step: may replay a captured graph
  std::pair<int, int> key;    // (batch bucket, kv bucket)
};

CudaBackend::CudaBackend(const std::filesystem::path& model_dir, const CudaBackendOptions& opts)
    : opts_(opts) {
  init(load_model_config(model_dir), &model_dir, 0);
}

CudaBackend::CudaBackend(const ModelConfig& cfg, uint64_t seed, const CudaBackendOptions& opts)
    : opts_(opts) {
  init(cfg, nullptr, seed);
}

CudaBackend::~CudaBackend() {
  // No throwing here: release what exists, ignore errors of an already failing device.
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  if (rank_.cublas) cublasDestroy(rank_.cublas);
  if (stream_) cudaStreamDestroy(stream_);
  for (void* p : {weight_mem_, kv_mem_, buf_mem_, cublas_ws_}) {
    if (p) cudaFree(p);
  }
  if (pinned_) cudaFreeHost(pinned_);
}

void CudaBackend::init(const ModelConfig& cfg, const std::filesystem::path* model_dir,
                       uint64_t seed) {
  cfg_ = cfg;
  const CudaBackendOptions& o = opts_;
  if (o.shard.world != 1 || o.shard.rank != 0) {
    throw InputError("cuda backend: one GPU per model for now (tensor parallelism is not built "
                     "yet), got world " + std::to_string(o.shard.world));
  }
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
    throw InputError("gpu_memory_utilization must be in (0, 1]");
  if (o.block_size < 1 || o.block_size > 1024) throw InputError("KV block size must be in [1, 1024]");
  if (o.max_num_seqs < 1 || o.max_num_batched_tokens < o.max_num_seqs || o.max_num_batched_tokens > 65535)
    throw InputError("cuda backend: need 1 <= max_num_seqs <= max_num_batched_tokens <= 65535");
  const int64_t hd = cfg_.head_dim;
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128)
    throw InputError("cuda backend: head_dim must be 16, 32, 64 or 128, got " + std::to_string(hd));
  if (cfg_.hidden_size % 32 != 0 || (cfg_.num_experts > 0 && cfg_.moe_intermediate_size % 32 != 0))
    throw InputError("cuda backend: hidden_size and moe_intermediate_size must be multiples of 32");
  max_model_len_ = o.max_model_len > 0 ? std::min(o.max_model_len, cfg_.max_position_embeddings)
                                       : cfg_.max_position_embeddings;
  rank_.dims = shard_dims(cfg_, o.shard);
  const ModelPlan wplan = plan_weights(cfg_, o.shard);
  std::unique_ptr<Checkpoint> ckpt;
  if (model_dir) ckpt = std::make_unique<Checkpoint>(*model_dir);  // header errors before allocating

  int devices = 0;
  const cudaError_t derr = cudaGetDeviceCount(&devices);
  if (derr != cudaSuccess || devices <= o.device || o.device < 0) {
    throw InputError(fmt::format("CUDA backend not available: device {} requested, {} found ({})",
                                 o.device, derr == cudaSuccess ? devices : 0,
                                 cudaGetErrorString(derr)));
  }
  CUDA_CHECK(cudaSetDevice(o.device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, o.device));
  StepCapacity cap;
  cap.tokens = o.max_num_batched_tokens;
  cap.logits_rows = o.max_num_seqs;
  cap.table_width = (max_model_len_ + o.block_size - 1) / o.block_size;
  cap.attn_splits = kMaxAttnSplits;
  plan_memory(weight_bytes(cfg_, rank_.dims, wplan), step_buffer_bytes(cfg_, rank_.dims, cap));

  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&rank_.cublas));
  // A fixed workspace: cuBLAS then allocates nothing while a decode graph is captured.
  CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
  CUBLAS_CHECK(cublasSetStream(rank_.cublas, stream_));
  CUBLAS_CHECK(cublasSetWorkspace(rank_.cublas, cublas_ws_, kCublasWorkspace));

  CUDA_CHECK(cudaMalloc(&weight_mem_, plan_.weights));
  rank_.weights = place_weights(cfg_, rank_.dims, wplan, weight_mem_);
  if (ckpt) {
    load_weights_device(*ckpt, cfg_, wplan, rank_.weights, stream_);
  } else {
    random_weights_device(seed, rank_.weights, stream_);
  }

  rank_.kv.block_size = o.block_size;
  rank_.kv.num_kv_heads = rank_.dims.num_kv_heads;
  rank_.kv.head_dim = hd;
  rank_.kv.num_blocks = plan_.kv_blocks + 1;  // + the scratch block of padded decode rows
  CUDA_CHECK(cudaMalloc(&kv_mem_, plan_.kv));
  rank_.kv.base = static_cast<bf16*>(kv_mem_);

  CUDA_CHECK(cudaMalloc(&buf_mem_, plan_.activations));
  rank_.buf = carve_step_buffers(buf_mem_, cfg_, rank_.dims, cap);
  CUDA_CHECK(cudaMemset(rank_.buf.route_counter, 0, sizeof(int32_t)));
  const size_t T = cap.tokens;
  pinned_bytes_ = sampling_staging_bytes() + (T * (6 + cap.table_width) + 1) * sizeof(int32_t);
  CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_));
}

void CudaBackend::plan_memory(size_t weights, size_t activations) {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const double util = opts_.gpu_memory_utilization;
  const size_t others = total - free;
  const double budget = util * static_cast<double>(total) - static_cast<double>(others);
  plan_.total = total;
  plan_.free_at_start = free;
  plan_.budget = budget > 0 ? static_cast<size_t>(budget) : 0;
  plan_.weights = weights;
  plan_.activations = activations;
  plan_.reserve = kReserve + kCublasWorkspace;
  const size_t per_block = static_cast<size_t>(cfg_.num_layers) * 2 * opts_.block_size *
                           rank_.dims.num_kv_heads * cfg_.head_dim * sizeof(bf16);
  const size_t fixed = weights + activations + plan_.reserve;
  const int64_t min_blocks = (max_model_len_ + opts_.block_size - 1) / opts_.block_size;
  auto describe = [&] {
    return fmt::format(
        "GPU memory plan: {:.2f} GiB total, {:.2f} GiB in use by others, gpu_memory_utilization "
        "{:.2f} → budget {:.2f} GiB; weights {:.2f} GiB + activations {:.2f} GiB + reserve "
        "{:.2f} GiB",
        gib(total), gib(others), util, gib(plan_.budget), gib(weights), gib(activations),
        gib(plan_.reserve));
  };
  if (static_cast<double>(fixed + (min_blocks + 1) * per_block) > budget) {
    throw InputError(fmt::format(
        "out of GPU memory at start: {}; the KV cache needs {:.2f} GiB more for one sequence of "
        "max_model_len {} tokens. Raise gpu_memory_utilization, lower max_model_len or "
        "max_num_batched_tokens, or use more GPUs",
        describe(), gib((min_blocks + 1) * per_block), max_model_len_));
  }
  size_t kv = static_cast<size_t>(budget) - fixed;
  if (opts_.max_kv_cache_bytes > 0) kv = std::min(kv, static_cast<size_t>(opts_.max_kv_cache_bytes));
  plan_.kv_blocks = static_cast<int64_t>(kv / per_block) - 1;
  if (plan_.kv_blocks < min_blocks) {
    throw InputError(fmt::format("KV cache of {:.3f} GiB holds {} blocks, fewer than one sequence "
                                 "of max_model_len {} tokens needs ({} blocks)",
                                 gib(kv), plan_.kv_blocks, max_model_len_, min_blocks));
  }
  plan_.kv = static_cast<size_t>(plan_.kv_blocks + 1) * per_block;
  spdlog::info("cuda backend: {} ({} layers, {} experts) on device {}", arch_name(cfg_.arch),
               cfg_.num_layers, cfg_.num_experts, opts_.device);
  spdlog::info("{}; KV cache {:.2f} GiB = {} blocks x {} tokens ({} tokens)", describe(),
               gib(plan_.kv), plan_.kv_blocks, opts_.block_size,
               plan_.kv_blocks * opts_.block_size);
}

CudaBackend::Chunk CudaBackend::prepare(const StepBatch& b, int t0, int t1) const {
  Chunk c;
  const int bs = static_cast<int>(opts_.block_size);
  const int scratch = static_cast<int>(plan_.kv_blocks);
  // Attention sequences: runs of consecutive positions of one sequence (query i of a run of
  // n_q tokens sits at kv_len - n_q + i, the attention kernels' contract).
  std::vector<int32_t> run_seq;
  int max_q = 0, max_kv = 0;
  for (int t = t0; t < t1; ++t) {
    const bool cont = t > t0 && b.seq_index[t] == b.seq_index[t - 1] &&
                      b.positions[t] == b.positions[t - 1] + 1;
    if (!cont) {
      c.q_start.push_back(t - t0);
      c.kv_lens.push_back(0);
      run_seq.push_back(b.seq_index[t]);
    }
    c.kv_lens.back() = b.positions[t] + 1;
    c.tokens.push_back(b.tokens[t]);
    c.positions.push_back(b.positions[t]);
    c.slots.push_back(b.slot_mapping[t]);
  }
  const int n = t1 - t0, seqs = static_cast<int>(run_seq.size());
  c.q_start.push_back(n);
  for (int s = 0; s < seqs; ++s) {
    max_q = std::max(max_q, c.q_start[s + 1] - c.q_start[s]);
    max_kv = std::max(max_kv, c.kv_lens[s]);
  }
  for (size_t i = 0; i < b.logits_rows.size(); ++i) {
    if (b.logits_rows[i] >= t0 && b.logits_rows[i] < t1) {
      c.logits_rows.push_back(b.logits_rows[i] - t0);
      c.out_rows.push_back(static_cast<int32_t>(i));
    }
  }
  bool all_rows = static_cast<int>(c.logits_rows.size()) == n;
  for (int i = 0; all_rows && i < n; ++i) all_rows = c.logits_rows[i] == i;
  StepShape& s = c.shape;
  s.decode = max_q == 1;
  c.decode_graph = s.decode && all_rows && n <= opts_.max_num_seqs;
  int width = (max_kv + bs - 1) / bs;
  if (c.decode_graph) {
    // Pad to a bucket so graphs exist for few shapes: padded rows read and write only the
    // scratch block. The kv bound is bucketed too (it sets the split-K ranges).
    int bucket = n <= 32 ? next_pow2(n) : (n + 31) / 32 * 32;
    bucket = std::min<int>(bucket, static_cast<int>(opts_.max_num_seqs));
    const int table_cap = static_cast<int>((max_model_len_ + bs - 1) / bs);
    const int kv_bucket = std::min(std::max(64, next_pow2(max_kv)), table_cap * bs);
    for (int i = n; i < bucket; ++i) {
      c.tokens.push_back(0);
      c.positions.push_back(0);
      c.slots.push_back(scratch * bs);
      c.q_start.push_back(i + 1);
      c.kv_lens.push_back(1);
      run_seq.push_back(-1);
      c.logits_rows.push_back(i);
    }
    width = (kv_bucket + bs - 1) / bs;
    const int nkv = static_cast<int>(rank_.dims.num_kv_heads);
    int splits = (2 * num_sms_ + bucket * nkv - 1) / (bucket * nkv);
    splits = std::clamp(std::min(splits, (kv_bucket + 31) / 32), 1, kMaxAttnSplits);
    s.tokens = s.seqs = bucket;
    s.max_kv_len = kv_bucket;
    s.attn_splits = splits;
    c.key = {bucket, kv_bucket};
  } else {
    s.tokens = n;
    s.seqs = seqs;
    s.max_kv_len = max_kv;
  }
  s.max_q_len = max_q;
  s.table_width = std::max(width, 1);
  c.tables.assign(static_cast<size_t>(s.seqs) * s.table_width, scratch);
  for (int r = 0; r < s.seqs; ++r) {
    if (run_seq[r] < 0) continue;
    const int32_t* src = b.block_tables.data() + run_seq[r] * b.max_blocks_per_seq;
    const int need = (c.kv_lens[r] + bs - 1) / bs;
    std::copy(src, src + need, c.tables.begin() + static_cast<size_t>(r) * s.table_width);
  }
  return c;
}

void CudaBackend::upload(const Chunk& c) {
  const StepBuffers& B = rank_.buf;
  // The previous chunk's copies may still read the staging area.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  char* host = static_cast<char*>(pinned_) + sampling_staging_bytes();
  auto put = [&](int32_t* dst, const std::vector<int32_t>& v) {
    const size_t bytes = v.size() * sizeof(int32_t);
    MB_CHECK(host + bytes <= static_cast<char*>(pinned_) + pinned_bytes_, "staging overflow");
    std::memcpy(host, v.data(), bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    host += bytes;
  };
  put(B.tokens, c.tokens);
  put(B.positions, c.positions);
  put(B.slots, c.slots);
  put(B.q_start, c.q_start);
  put(B.kv_lens, c.kv_lens);
  put(B.block_tables, c.tables);
  put(B.logits_rows, c.logits_rows);
}

void CudaBackend::run_chunk(const Chunk& c) {
  const int rows = c.shape.tokens;
  auto launch = [&](StageTimer* tm) {
    cuda_forward(cfg_, rank_, c.shape, stream_, tm);
    cuda_lm_head(cfg_, rank_, 0, rows, c.shape.tokens, stream_, tm);
  };
  if (!opts_.cuda_graphs || timer_) {
    launch(timer_);
    return;
  }
  auto it = graphs_.find(c.key);
  if (it != graphs_.end()) {
    CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    return;
  }
  // First step of this shape: run it eagerly (module loading and cuBLAS heuristics happen
  // outside the capture), then capture the same launches for later steps.
  launch(nullptr);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    launch(nullptr);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  graphs_.emplace(c.key, exec);
}

template <class OnRows>
void CudaBackend::run(const StepBatch& b, OnRows&& on_rows) {
  validate_step_batch(b, cfg_, plan_.kv_blocks, opts_.block_size, max_model_len_);
  const int n = static_cast<int>(b.tokens.size());
  const int T = static_cast<int>(rank_.buf.cap.tokens), R = static_cast<int>(rank_.buf.cap.logits_rows);
  for (int t0 = 0; t0 < n; t0 += T) {
    const Chunk c = prepare(b, t0, std::min(n, t0 + T));
    upload(c);
    const int real = static_cast<int>(c.out_rows.size());
    if (c.decode_graph) {
      run_chunk(c);
      on_rows(c.out_rows.data(), real);
      continue;
    }
    cuda_forward(cfg_, rank_, c.shape, stream_, timer_);
    for (int r0 = 0; r0 < real; r0 += R) {
      const int cnt = std::min(R, real - r0);
      cuda_lm_head(cfg_, rank_, r0, cnt, c.shape.tokens, stream_, timer_);
      on_rows(c.out_rows.data() + r0, cnt);
    }
  }
}

void CudaBackend::forward(const StepBatch& batch, std::vector<float>& logits) {
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  logits.resize(batch.logits_rows.size() * V);
  std::vector<float> rows_host;
  run(batch, [&](const int32_t* out_rows, int count) {
    rows_host.resize(static_cast<size_t>(count) * V);
    CUDA_CHECK(cudaMemcpyAsync(rows_host.data(), rank_.buf.logits, rows_host.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < count; ++i)
      std::copy_n(rows_host.data() + i * V, V, logits.data() + static_cast<size_t>(out_rows[i]) * V);
  });
}

void CudaBackend::forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                                 std::vector<int32_t>& tokens) {
  MB_CHECK(rows.size() == batch.logits_rows.size(), "one sampling row per logits row");
  tokens.assign(rows.size(), 0);
  StepBuffers& B = rank_.buf;
  const size_t R = static_cast<size_t>(B.cap.logits_rows);
  // Sampling staging sits at the start of the pinned buffer (8-byte aligned), step inputs after.
  char* base = static_cast<char*>(pinned_);
  auto* temp = reinterpret_cast<float*>(base);
  auto* topk = reinterpret_cast<int32_t*>(base + R * 4);
  auto* topp = reinterpret_cast<float*>(base + R * 8);
  auto* seeds = reinterpret_cast<uint64_t*>(base + R * 16);  // 8-byte aligned: R * 16
  auto* steps = reinterpret_cast<uint64_t*>(base + R * 24);
  auto* out = reinterpret_cast<int32_t*>(base + R * 32);
  run(batch, [&](const int32_t* out_rows, int count) {
    bool greedy = true;
    for (int i = 0; i < count; ++i) {
      const RowSampling& s = rows[out_rows[i]];
      temp[i] = s.temperature;
      topk[i] = s.top_k;
      topp[i] = s.top_p;
      seeds[i] = s.seed;
      steps[i] = s.step;
      greedy = greedy && s.temperature <= 0.0f;
    }
    const int V = static_cast<int>(cfg_.vocab_size);
    if (greedy) {
      kernels::sample_greedy(B.sampled, B.logits, count, V, stream_);
    } else {
      CUDA_CHECK(cudaMemcpyAsync(B.temperature, temp, count * 4, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(B.top_k, topk, count * 4, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(B.top_p, topp, count * 4, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(B.seeds, seeds, count * 8, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(B.steps, steps, count * 8, cudaMemcpyHostToDevice, stream_));
      kernels::SamplingParams sp;
      sp.out_tokens = B.sampled;
      sp.logits = B.logits;
      sp.temperature = B.temperature;
      sp.top_k = B.top_k;
      sp.top_p = B.top_p;
      sp.seeds = B.seeds;
      sp.steps = B.steps;
      sp.batch = count;
      sp.vocab = V;
      kernels::sample_top_k_top_p(sp, stream_);
    }
    CUDA_CHECK(cudaMemcpyAsync(out, B.sampled, count * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < count; ++i) tokens[out_rows[i]] = out[i];
  });
}

std::vector<std::pair<std::string, double>> CudaBackend::profile(const StepBatch& batch) {
  StageTimer timer;
  timer_ = &timer;
  try {
    run(batch, [&](const int32_t*, int) {});
  } catch (...) {
    timer_ = nullptr;
    throw;
  }
  timer_ = nullptr;
  timer.collect();
  return timer.totals();
}

std::unique_ptr<Engine> make_cuda_engine(const std::filesystem::path& model_dir,
                                         CudaBackendOptions backend_opts,
                                         const EngineOptions& engine_opts) {
  backend_opts.max_num_seqs = engine_opts.max_num_seqs;
  backend_opts.max_num_batched_tokens =
      std::max(engine_opts.max_num_batched_tokens, engine_opts.max_num_seqs);
  return std::make_unique<Engine>(std::make_unique<CudaBackend>(model_dir, backend_opts),
                                  engine_opts);
}

}  // namespace moebatch
