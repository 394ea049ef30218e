// CudaRank: allocation and loading on the rank's device, step-input upload, decode graphs
// (eager first run, then capture and replay), logits download and device sampling.
#include "engine/cuda/cuda_rank.h"

#include <algorithm>

#include <cstring>

#include "common/error.h"
#include "engine/cuda/device_memory.h"
#include "engine/cuda/forward.h"
#include "kernels/cuda_check.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/sampling.cuh"

namespace moebatch {

CudaRank::CudaRank(const ModelConfig& cfg, const ShardSpec& shard, int device_ordinal,
                   Communicator* communicator)
    : rank(shard.rank),
      world(shard.world),
      device(device_ordinal),
      comm(communicator),
      dims(shard_dims(cfg, shard)) {}

CudaRank::~CudaRank() {
  if (!probed_) return;
  // No throwing here: release what exists, ignore errors of an already failing device.
  int prev = -1;
  const bool had_device = cudaGetDevice(&prev) == cudaSuccess;
  cudaSetDevice(device);
  if (stream) cudaStreamSynchronize(stream);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  fp8_gemm_.reset();
  if (cublas) cublasDestroy(cublas);
  if (stream) cudaStreamDestroy(stream);
  for (void* p : {weight_mem_, kv_mem_, state_mem_, buf_mem_, cublas_ws_, static_cast<void*>(dequant_),
                  static_cast<void*>(a8_), block_scales_mem_}) {
    if (p) cudaFree(p);
  }
  if (pinned_) cudaFreeHost(pinned_);
  if (host_offsets) cudaFreeHost(host_offsets);
  if (group_ptrs_host_) cudaFreeHost(const_cast<void**>(group_ptrs_host_));
  if (group_ptrs_dev_) cudaFree(const_cast<void**>(group_ptrs_dev_));
  if (had_device) cudaSetDevice(prev);
}

void CudaRank::activate() const { CUDA_CHECK(cudaSetDevice(device)); }

void CudaRank::probe(size_t& total, size_t& free) {
  probed_ = true;
  activate();
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
}

void CudaRank::build(const ModelConfig& cfg, const ModelPlan& wplan, const MemoryPlan& p,
                     const StepCapacity& cap, int64_t block_size, const WeightSource* ckpt,
                     uint64_t seed) {
  activate();
  plan = p;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cublas));
  CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
  CUBLAS_CHECK(cublasSetStream(cublas, stream));
  CUBLAS_CHECK(cublasSetWorkspace(cublas, cublas_ws_, kCublasWorkspace));
  if (wgmma_experts || tma_experts) kernels::moe_wgmma_prepare();
  if (stream_gemv) kernels::gemv_stream_prepare();
  if (cluster_router) cluster_router = kernels::moe_route_small_prepare_cluster();  // else the ticket form
  if (w8a8_linear) fp8_gemm_ = std::make_unique<kernels::Fp8BlockGemm>(cublas_ws_, kCublasWorkspace);

  CUDA_CHECK(cudaMalloc(&weight_mem_, plan.weights));
  weights = place_weights(cfg, dims, wplan, weight_mem_);
  if (ckpt) {
    load_weights_device(*ckpt, cfg, wplan, weights, stream);
  } else {
    random_weights_device(seed, wplan, weights, stream);
  }

  kv.block_size = block_size;
  kv.num_kv_heads = dims.num_kv_heads;
  kv.head_dim = cfg.head_dim;
  kv.num_blocks = plan.kv_blocks + 1;  // + the scratch block of padded decode rows
  CUDA_CHECK(cudaMalloc(&kv_mem_, plan.kv));
  kv.base = static_cast<bf16*>(kv_mem_);
  if (plan.state > 0) {
    MB_CHECK(plan.state == DeviceLinearState::bytes(cfg, dims, cap.logits_rows),
             "memory plan: state bytes differ from the state slots");
    CUDA_CHECK(cudaMalloc(&state_mem_, plan.state));
    CUDA_CHECK(cudaMemsetAsync(state_mem_, 0, plan.state, stream));
    lin_state = {.base = static_cast<float*>(state_mem_), .slots = cap.logits_rows,
                 .per_slot = linear_state_floats(cfg, dims)};
  }

  if (w8a8_linear) attach_block_scales();
  dequant_elems_ = dequant_scratch_elems(wplan);  // counted in plan.activations, as a8_bytes_
  if (dequant_elems_ > 0) CUDA_CHECK(cudaMalloc(&dequant_, dequant_elems_ * sizeof(bf16)));
  a8_bytes_ = w8a8_linear ? w8a8_linear_bytes(wplan, cap.tokens) : 0;
  if (a8_bytes_ > 0) CUDA_CHECK(cudaMalloc(&a8_, a8_bytes_));
  CUDA_CHECK(cudaMalloc(&buf_mem_, plan.activations - dequant_elems_ * sizeof(bf16) - a8_bytes_));
  buf = carve_step_buffers(buf_mem_, cfg, dims, cap);
  CUDA_CHECK(cudaMemsetAsync(buf.route_counter, 0, sizeof(int32_t), stream));
  CUDA_CHECK(cudaMemsetAsync(buf.norm_counter, 0, sizeof(uint32_t), stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t T = cap.tokens;
  pinned_bytes_ = sampling_staging_bytes() + (T * (7 + cap.table_width) + 1) * sizeof(int32_t);
  CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_));
  CUDA_CHECK(cudaMallocHost(&host_offsets, (std::max<int64_t>(dims.num_experts, 1) + 1) * sizeof(int32_t)));
  group_cap_ = static_cast<int>(std::max<int64_t>(dims.num_experts, 1));
  const size_t ptr_bytes = kGroupedStages * 3 * static_cast<size_t>(group_cap_) * sizeof(void*);
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&group_ptrs_host_), ptr_bytes));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&group_ptrs_dev_), ptr_bytes));
}

void CudaRank::attach_block_scales() {
  // The weights' per-row scales hold each block's scale 128 times; the GEMM reads the block grid.
  // Hundreds of KB for the MoE shapes, a few MB for a dense model's wide MLP: inside the plan's
  // reserve.
  std::vector<DeviceTensor*> takes;
  size_t floats = 0;
  for (auto& L : weights.layers)
    L.zip(L, [&](DeviceTensor& t, const DeviceTensor&) {
      if (t.shape.size() != 2 || t.format != WeightFormat::Fp8Block || t.scale_rows != kernels::kFp8BlockGemmGroup ||
          t.group != kernels::kFp8BlockGemmGroup || !kernels::Fp8BlockGemm::takes(4, static_cast<int>(t.rows()),
                                                                                  static_cast<int>(t.cols())))
        return;
      takes.push_back(&t);
      floats += static_cast<size_t>(t.rows() / kernels::kFp8BlockGemmGroup) *
                kernels::fp8_block_scale_ld(static_cast<int>(t.cols()));
    });
  if (takes.empty()) return;
  CUDA_CHECK(cudaMalloc(&block_scales_mem_, floats * sizeof(float)));
  auto* next = static_cast<float*>(block_scales_mem_);
  for (DeviceTensor* t : takes) {
    const int cols = static_cast<int>(t->cols()), ld = kernels::fp8_block_scale_ld(cols);
    kernels::compact_block_scales(static_cast<const float*>(t->scales), t->rows(), cols / t->group, next, ld,
                                  stream);
    t->block_scales = next;
    next += static_cast<size_t>(t->rows() / kernels::kFp8BlockGemmGroup) * ld;
  }
}

void CudaRank::upload(const StepChunk& c) {
  // The previous chunk's copies may still read the staging area.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  char* host = static_cast<char*>(pinned_) + sampling_staging_bytes();
  auto put = [&](int32_t* dst, const std::vector<int32_t>& v) {
    const size_t bytes = v.size() * sizeof(int32_t);
    MB_CHECK(host + bytes <= static_cast<char*>(pinned_) + pinned_bytes_, "staging overflow");
    std::memcpy(host, v.data(), bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream));
    host += bytes;
  };
  put(buf.tokens, c.tokens);
  put(buf.positions, c.positions);
  put(buf.slots, c.slots);
  put(buf.q_start, c.q_start);
  put(buf.kv_lens, c.kv_lens);
  put(buf.block_tables, c.tables);
  put(buf.logits_rows, c.logits_rows);
  if (!c.state_slots.empty()) put(buf.state_slots, c.state_slots);
}

void CudaRank::run_decode(const ModelConfig& cfg, const StepChunk& c, bool graphs, StageTimer* tm) {
  const int rows = c.shape.tokens;
  auto launch = [&](StageTimer* t) {
    cuda_forward(cfg, *this, c.shape, t);
    cuda_lm_head(cfg, *this, 0, rows, c.shape.tokens, t);
  };
  if (!graphs) {
    launch(tm);
    return;
  }
  auto it = graphs_.find(c.key);
  if (it != graphs_.end()) {
    CUDA_CHECK(cudaGraphLaunch(it->second, stream));
    return;
  }
  // First step of this shape: run it eagerly (module loading and cuBLAS heuristics happen
  // outside the capture), then capture the same launches for later steps. Every rank takes
  // this branch in the same step, so their collectives stay paired.
  launch(nullptr);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    launch(nullptr);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  graphs_.emplace(c.key, exec);
}

void CudaRank::download_logits(float* host, int count, int64_t vocab) {
  CUDA_CHECK(cudaMemcpyAsync(host, buf.logits, static_cast<size_t>(count) * vocab * sizeof(float),
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void CudaRank::sample(const std::vector<RowSampling>& rows, const int32_t* out_rows, int count,
                      int64_t vocab, std::vector<int32_t>& tokens) {
  StepBuffers& B = buf;
  const size_t R = static_cast<size_t>(B.cap.logits_rows);
  // Sampling staging sits at the start of the pinned buffer (8-byte aligned), step inputs after.
  char* base = static_cast<char*>(pinned_);
  auto* temp = reinterpret_cast<float*>(base);
  auto* topk = reinterpret_cast<int32_t*>(base + R * 4);
  auto* topp = reinterpret_cast<float*>(base + R * 8);
  auto* seeds = reinterpret_cast<uint64_t*>(base + R * 16);  // 8-byte aligned: R * 16
  auto* steps = reinterpret_cast<uint64_t*>(base + R * 24);
  auto* out = reinterpret_cast<int32_t*>(base + R * 32);
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
  const int V = static_cast<int>(vocab);
  if (greedy) {
    kernels::sample_greedy(B.sampled, B.logits, count, V, stream);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(B.temperature, temp, count * 4, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(B.top_k, topk, count * 4, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(B.top_p, topp, count * 4, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(B.seeds, seeds, count * 8, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(B.steps, steps, count * 8, cudaMemcpyHostToDevice, stream));
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
    kernels::sample_top_k_top_p(sp, stream);
  }
  CUDA_CHECK(cudaMemcpyAsync(out, B.sampled, count * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int i = 0; i < count; ++i) tokens[out_rows[i]] = out[i];
}

}  // namespace moebatch
