// The CUDA engine on the Qwen3-30B-A3B shape (hidden 2048, 48 layers, 32 q / 4 kv heads of 128,
// 128 experts top-8, moe_intermediate 768, vocab 151936) with seeded random bf16 weights made on
// the GPU through the backend's own weight structs. 128-token prompts; per batch (1, 64, 256):
// prefill tok/s, decode step time (graph replay, wall clock including the host's step work and
// the sampled tokens' copy back) and tok/s, the roofline of each (bytes that must move / the
// measured copy bandwidth; prefill also FLOPs / the cuBLAS peak), and a per-stage breakdown of one
// eager decode step from CUDA events; then one prefill of 8 prompts of 1024 tokens (the users'
// long prompts: attention grows with the length). An optional HF peer JSON (bench/gpu/hf_peer_engine.py, run
// first in the same call) adds the ratio.
// Tensor parallel: --tp N runs the model over N GPUs, --ep with whole experts per rank
// (expert parallel) instead of every expert's intermediate dim split; the stage breakdown then
// shows the all-reduces (2 per layer, rank 0's stream: the collective plus any wait for the
// peers; with the peer-to-peer all-reduce fused with the add + RMSNorm after it, stage
// all_reduce_add_norm, else NCCL's all_reduce and a separate norm) and the lm_head all-gather,
// and the table their time per step. --disable-custom-all-reduce: NCCL for every all-reduce.
// The roofline divides the bytes evenly over the GPUs (ideal split).
// --quantization fp8|nvfp4 quantizes the linear weights on the GPU (router, embeddings and
// lm_head stay bf16); the rooflines count the bytes each format holds.
// --moe-sorted-min-rows N sets when prefill experts take the sorted path (0: never);
// --disable-wgmma-experts runs that path's experts on cuBLAS instead of the wgmma kernel;
// --disable-w8a8-experts decodes FP8 experts to bf16 for it instead of running them W8A8;
// --disable-stream-gemv keeps one-row bf16 projections on the register-fed GEMV;
// --disable-router-norm keeps the one-token MLP norm in a launch of its own;
// --disable-wgmma-attention keeps prefill attention off the wgmma kernel (mma.sync; head_dim 256:
// the CUDA-core kernel); --disable-w8a8-linear decodes FP8 projections to bf16 for cuBLAS
// instead of running them W8A8 on cuBLASLt; --disable-fused-rope runs decode steps' q/k norm +
// rope + cache write as a launch of its own instead of inside the decode attention kernel (the
// warp kernel of large batches); --disable-prefill-rope-q rotates prefill steps' q in the
// qk_norm_rope launch instead of inside the prefill attention (CudaBackendOptions::prefill_rope_q);
// --disable-cluster-attention-merge merges the split
// kernel's partials through the workspace and a ticket instead of a cluster's shared memory;
// --disable-cluster-router runs decode steps' router as 32 blocks meeting by a ticket instead of
// one 16-block cluster (CudaBackendOptions::cluster_router); --disable-pdl-trigger-early lets
// the next kernel launch only after the wait of the decode step's projections, rope, attention
// and router, not at their start (CudaBackendOptions::pdl_trigger_early);
// --combine-norm-in-qkv forms one token's pending MoE combine + add + norm inside the qkv GEMV
// (kernels::gemv_stream_combine_norm) instead of a one-block launch before it;
// --disable-mma-gemv runs decode steps' 4-bit expert GEMVs on CUDA cores instead of tensor cores;
// --attn-min-split-keys N gives each split of decode attention at least N keys (fewer splits);
// --disable-combine-in-down keeps one token's MoE combine + residual add in the next norm's launch
// instead of the down expert GEMV (CudaBackendOptions::combine_in_down).
// A build with -DMOEBATCH_STEP_TRACE=ON also prints, per decode batch, where one graph-replayed
// step's time goes kernel by kernel (kernels/step_trace.cuh): per call site, the time each kernel
// adds to the step's critical path, and one layer's kernels in order.
// Usage: moebatch_bench_engine_cuda [--shape NAME] [--tp N] [--ep] [--disable-custom-all-reduce]
//                                   [--disable-wgmma-experts]
//                                   [--disable-w8a8-experts]
//                                   [--disable-stream-gemv] [--disable-tma-experts] [--disable-router-norm]
//                                   [--disable-wgmma-attention]
//                                   [--disable-fused-rope] [--disable-prefill-rope-q]
//                                   [--disable-cluster-attention-merge]
//                                   [--disable-cluster-router] [--disable-pdl-trigger-early]
//                                   [--combine-norm-in-qkv]
//                                   [--disable-mma-gemv] [--attn-min-split-keys N] [--disable-combine-in-down]
//                                   [--disable-w8a8-linear]
//                                   [--quantization Q]
//                                   [--moe-sorted-min-rows N] [out.json]
//                                   [peer.json]
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/cuda_backend.h"
#include "engine/model_shapes.h"
#include "kernels/cuda_check.cuh"
#include "kernels/step_trace.cuh"

namespace {

using namespace moebatch;
using Clock = std::chrono::steady_clock;

constexpr int kPrompt = 128, kWarmSteps = 4, kTimedSteps = 24;
constexpr int kLongPrompts = 8, kLongPrompt = 1024;  // the long-prompt prefill line
constexpr double kGemmPeakFlops = 787e12;  // bf16 cuBLAS 8192³ on this H200 (performance.md)

// Device-to-device copy bandwidth (bytes read + written per second), median of 10.
double copy_bandwidth() {
  const size_t n = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaMalloc(&a, n));
  CUDA_CHECK(cudaMalloc(&b, n));
  CUDA_CHECK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    CUDA_CHECK(cudaEventRecord(e0));
    CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / (ms[ms.size() / 2] * 1e-3);
}

// Parameters per component of the model (bf16: 2 bytes each). Mixers are summed over the
// layers by kind: full attention (q (+ gate), k, v, o) or Gated DeltaNet (in_proj, conv,
// out_proj).
struct Params {
  double mixers, router_layer, expert, shared_layer, lm_head, total;
};
Params count_params(const ModelConfig& c) {
  Params p;
  const double H = c.hidden_size, qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const double attn = H * qd * (c.attn_output_gate ? 3 : 2) + H * kvd * 2 + 2 * H + 2 * c.head_dim;
  const LinearAttentionDims& a = c.linear;
  const double lin_in = H * (2.0 * a.num_k_heads * a.k_head_dim + 2.0 * a.num_v_heads * a.v_head_dim +
                             2.0 * a.num_v_heads);
  const double lin = lin_in + H * a.num_v_heads * a.v_head_dim + a.conv_dim() * a.conv_kernel + 2 * H;
  p.mixers = c.num_kv_layers() * attn + c.num_linear_layers() * lin;
  p.router_layer = c.num_experts * H;
  p.expert = 3.0 * c.moe_intermediate_size * H;
  p.shared_layer = c.shared_expert_intermediate_size > 0 ? 3.0 * c.shared_expert_intermediate_size * H + H : 0;
  p.lm_head = c.vocab_size * H;
  p.total = p.mixers + c.num_layers * (p.router_layer + c.num_experts * p.expert + p.shared_layer) +
            2 * p.lm_head + H;
  return p;
}

// Bytes per parameter of the linear (attention and expert) weights in the format they are held:
// values plus scales (fp8: an f32 per 128 inputs; nvfp4: an e4m3 per 16 and an f32 per row).
double linear_bytes_per_param(Quantization q) {
  switch (q) {
    case Quantization::Fp8:
      return 1.0 + 4.0 / 128;
    case Quantization::Nvfp4:
      return 0.5 + 1.0 / 16;
    case Quantization::Int4:
      return 0.5 + 8.0 / 32;
    default:
      return 2.0;
  }
}

// Bytes a decode step of `batch` sequences at context `ctx` must move: mixer, router and shared-
// expert weights, the experts the batch touches (expected distinct experts of uniform top-k
// routing), the lm_head, the KV cache read, and the fp32 recurrent state of linear-attention
// layers read and written; linear weights at `lin` bytes per parameter.
double decode_bytes(const ModelConfig& c, const Params& p, int batch, int ctx, double lin) {
  const double hit = c.num_experts *
                     (1.0 - std::pow(1.0 - double(c.num_experts_per_tok) / c.num_experts, batch));
  const double linear = p.mixers + c.num_layers * (hit * p.expert + p.shared_layer);
  const double plain = c.num_layers * p.router_layer + p.lm_head;
  const double kv = double(batch) * ctx * c.num_kv_layers() * 2 * c.num_kv_heads * c.head_dim;
  const double state = 2.0 * batch * c.num_linear_layers() * c.linear.state_floats() * sizeof(float);
  return lin * linear + 2.0 * (plain + kv) + state;
}

struct Seqs {
  StepBatch prefill;  // every prompt token, logits at each prompt's last token
  std::vector<std::vector<int32_t>> tables;
  int width = 0;
};

Seqs make_prompts(int batch, int64_t vocab, int width, std::mt19937& rng, int prompt = kPrompt) {
  Seqs s;
  s.width = width;
  StepBatch& b = s.prefill;
  b.max_blocks_per_seq = width;
  for (int i = 0; i < batch; ++i) {
    for (int j = 0; j < width; ++j) b.block_tables.push_back(i * width + j);
    for (int p = 0; p < prompt; ++p) {
      b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
      b.positions.push_back(p);
      b.seq_index.push_back(i);
      b.slot_mapping.push_back((i * width + p / 16) * 16 + p % 16);
    }
    b.logits_rows.push_back(i * prompt + prompt - 1);
    b.state_slots.push_back(i);  // linear-attention models: sequence i keeps its state in slot i
  }
  return s;
}

StepBatch decode_step(const Seqs& s, const std::vector<int32_t>& tokens, int pos) {
  StepBatch b;
  b.max_blocks_per_seq = s.width;
  b.block_tables = s.prefill.block_tables;
  b.state_slots = s.prefill.state_slots;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int i32 = static_cast<int>(i);
    b.tokens.push_back(tokens[i]);
    b.positions.push_back(pos);
    b.seq_index.push_back(i32);
    b.slot_mapping.push_back((i32 * s.width + pos / 16) * 16 + pos % 16);
    b.logits_rows.push_back(i32);
  }
  return b;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::string out_path = "bench_engine_cuda.json";
  std::string peer_path;
  std::string shape = "qwen3-30b-a3b";  ///< engine/model_shapes.h
  int64_t sorted_min_rows = -1;          ///< moe_sorted_min_rows_per_expert (−1: the default)
  int tp = 1;
  bool ep = false;
  bool custom_all_reduce = true;
  bool wgmma_experts = true;             ///< --disable-wgmma-experts: prefill experts on cuBLAS
  bool w8a8_experts = true;              ///< --disable-w8a8-experts: FP8 experts decoded to bf16
  bool stream_gemv = true;               ///< --disable-stream-gemv: one-row bf16 GEMV from registers
  bool tma_experts = true;               ///< --disable-tma-experts: decode experts on moe_gemm
  bool router_norm = true;               ///< --disable-router-norm: the MLP norm in its own launch
  bool wgmma_attention = true;           ///< --disable-wgmma-attention: prefill off the wgmma kernel
  bool fused_rope = true;                ///< --disable-fused-rope: decode's rope in its own launch
  bool prefill_rope_q = true;            ///< --disable-prefill-rope-q: prefill's q rotated in the rope launch
  bool cluster_merge = true;             ///< --disable-cluster-attention-merge: the workspace merge
  bool cluster_router = true;            ///< --disable-cluster-router: the ticket form
  bool trigger_early = true;             ///< --disable-pdl-trigger-early: after the wait
  bool combine_norm_in_qkv = false;      ///< --combine-norm-in-qkv: one token's layer norm in the qkv GEMV
  bool mma_gemv = true;                  ///< --disable-mma-gemv: 4-bit expert GEMVs on CUDA cores
  int min_split_keys = -1;               ///< --attn-min-split-keys N: decode attention's keys a split
  bool combine_in_down = true;           ///< --disable-combine-in-down: false
  bool w8a8_linear = true;               ///< --disable-w8a8-linear: FP8 projections decoded to bf16
  Quantization quant = Quantization::None;
};

Args parse_args(int argc, char** argv) {
  Args a;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tp" && i + 1 < argc) {
      a.tp = std::stoi(argv[++i]);
    } else if (arg == "--ep") {
      a.ep = true;
    } else if (arg == "--disable-custom-all-reduce") {
      a.custom_all_reduce = false;
    } else if (arg == "--disable-wgmma-experts") {
      a.wgmma_experts = false;
    } else if (arg == "--disable-w8a8-experts") {
      a.w8a8_experts = false;
    } else if (arg == "--disable-stream-gemv") {
      a.stream_gemv = false;
    } else if (arg == "--disable-tma-experts") {
      a.tma_experts = false;
    } else if (arg == "--disable-wgmma-attention") {
      a.wgmma_attention = false;
    } else if (arg == "--disable-cluster-attention-merge") {
      a.cluster_merge = false;
    } else if (arg == "--disable-cluster-router") {
      a.cluster_router = false;
    } else if (arg == "--disable-pdl-trigger-early") {
      a.trigger_early = false;
    } else if (arg == "--disable-fused-rope") {
      a.fused_rope = false;
    } else if (arg == "--disable-prefill-rope-q") {
      a.prefill_rope_q = false;
    } else if (arg == "--combine-norm-in-qkv") {
      a.combine_norm_in_qkv = true;
    } else if (arg == "--disable-mma-gemv") {
      a.mma_gemv = false;
    } else if (arg == "--disable-combine-in-down") {
      a.combine_in_down = false;
    } else if (arg == "--attn-min-split-keys" && i + 1 < argc) {
      a.min_split_keys = std::stoi(argv[++i]);
    } else if (arg == "--disable-w8a8-linear") {
      a.w8a8_linear = false;
    } else if (arg == "--disable-router-norm") {
      a.router_norm = false;
    } else if (arg == "--shape" && i + 1 < argc) {
      a.shape = argv[++i];
    } else if (arg == "--moe-sorted-min-rows" && i + 1 < argc) {
      a.sorted_min_rows = std::stoll(argv[++i]);
    } else if (arg == "--quantization" && i + 1 < argc) {
      a.quant = parse_quantization(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: moebatch_bench_engine_cuda [--shape NAME] [--tp N] [--ep] [--disable-custom-all-reduce] [--disable-wgmma-experts] [--disable-w8a8-experts] [--disable-stream-gemv] [--disable-router-norm] [--disable-wgmma-attention] [--disable-fused-rope] [--disable-prefill-rope-q] [--disable-cluster-attention-merge] [--disable-cluster-router] [--disable-pdl-trigger-early] [--combine-norm-in-qkv] [--disable-mma-gemv] [--attn-min-split-keys N] [--disable-combine-in-down] [--disable-w8a8-linear] [--quantization Q] [--moe-sorted-min-rows N] [out.json] [peer.json]\n");
      std::exit(2);
    } else if (positional++ == 0) {
      a.out_path = arg;
    } else {
      a.peer_path = arg;
    }
  }
  if (a.tp < 1) {
    std::fprintf(stderr, "--tp must be >= 1\n");
    std::exit(2);
  }
  return a;
}

// Milliseconds of the stage `name` in a profile (0 when absent).
double stage_ms(const std::vector<std::pair<std::string, double>>& stages, const char* name) {
  for (const auto& [n, t] : stages)
    if (n == name) return t;
  return 0;
}

}  // namespace

// A traced step (kernels/step_trace.cuh), printed: per call site (file:line, grid size) the
// kernels' count, the time each adds to the critical path (the next kernel's pdl_sync return
// minus its own) and how long each waited in pdl_sync (its preamble ran under the kernel
// before); then the kernels of the layer in the middle of the step, in order.
void print_step_trace(const std::vector<kernels::StepTraceSample>& t, int num_layers) {
  if (t.size() < 2) return;
  struct Site {
    int count = 0;
    double crit_us = 0, wait_us = 0;
  };
  auto name = [](const kernels::StepTraceSample& s) {
    const size_t slash = s.file.rfind('/');
    return (slash == std::string::npos ? s.file : s.file.substr(slash + 1)) + ":" + std::to_string(s.line) + " [" +
           std::to_string(s.blocks) + "]";
  };
  std::vector<std::pair<std::string, Site>> sites;
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    const std::string key = name(t[i]);
    auto it = std::find_if(sites.begin(), sites.end(), [&](const auto& e) { return e.first == key; });
    if (it == sites.end()) it = sites.insert(sites.end(), {key, Site{}});
    it->second.count++;
    it->second.crit_us += (t[i + 1].after - t[i].after) * 1e-3;
    it->second.wait_us += (t[i].after - t[i].before) * 1e-3;
  }
  std::sort(sites.begin(), sites.end(), [](const auto& a, const auto& b) { return a.second.crit_us > b.second.crit_us; });
  std::printf("  step trace: %zu kernels, first to last pdl_sync %.1f us\n", t.size(), (t.back().after - t.front().after) * 1e-3);
  std::printf("  %-40s %6s %12s %12s %12s\n", "call site [blocks]", "count", "crit us", "crit us/call", "wait us/call");
  for (const auto& [key, s] : sites)
    std::printf("  %-40s %6d %12.1f %12.2f %12.2f\n", key.c_str(), s.count, s.crit_us, s.crit_us / s.count,
                s.wait_us / s.count);
  // The SM clock while a kernel's marks ran (kernels/step_trace.cuh STEP_TRACE_MARK_IF): two
  // samples in a row from one SM and one file are one block's thread, so cycles over ns is its
  // SM's rate — the DVFS clock of a latency-bound step, which no other counter here shows.
  double cycles = 0, ns = 0;
  for (size_t i = 0; i + 1 < t.size(); ++i)
    if (t[i].sm == t[i + 1].sm && t[i].file == t[i + 1].file && t[i + 1].after > t[i].after &&
        t[i + 1].clock > t[i].clock) {
      cycles += static_cast<double>(t[i + 1].clock - t[i].clock);
      ns += static_cast<double>(t[i + 1].after - t[i].after);
    }
  if (ns > 0) std::printf("  SM clock between one block's marks: %.0f MHz (%.0f us of them)\n", cycles / ns * 1e3, ns * 1e-3);
  const size_t per_layer = t.size() / static_cast<size_t>(std::max(num_layers, 1));
  const size_t first = per_layer * static_cast<size_t>(num_layers / 2);
  std::printf("  one layer (kernels %zu..%zu of the step), in order:\n", first, first + per_layer - 1);
  for (size_t i = first; i < first + per_layer && i + 1 < t.size(); ++i)
    std::printf("    %-40s crit %6.2f us  wait %6.2f us\n", name(t[i]).c_str(), (t[i + 1].after - t[i].after) * 1e-3,
                (t[i].after - t[i].before) * 1e-3);
}

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  nlohmann::json peer;
  if (!args.peer_path.empty()) {
    std::ifstream f(args.peer_path);
    if (f) peer = nlohmann::json::parse(f, nullptr, false);
  }
  const double bw = copy_bandwidth();
  const ModelConfig cfg = named_model_shape(args.shape);
  const Params P = count_params(cfg);
  CudaBackendOptions o;
  o.max_num_seqs = 256;
  o.max_num_batched_tokens = 8192;
  o.max_model_len = 1024;
  o.tensor_parallel_size = args.tp;
  o.expert_split = args.ep ? ExpertSplit::Expert : ExpertSplit::Intermediate;
  if (!args.custom_all_reduce) o.custom_all_reduce_max_bytes = 0;
  o.quantization = args.quant;
  if (args.sorted_min_rows >= 0) o.moe_sorted_min_rows_per_expert = args.sorted_min_rows;
  o.wgmma_experts = args.wgmma_experts;
  o.w8a8_experts = args.w8a8_experts;
  o.stream_gemv = args.stream_gemv;
  o.wgmma_attention = args.wgmma_attention;
  o.fused_rope_attention = args.fused_rope;
  o.prefill_rope_q = args.prefill_rope_q;
  o.cluster_attention_merge = args.cluster_merge;
  o.cluster_router = args.cluster_router;
  o.pdl_trigger_early = args.trigger_early;
  o.combine_norm_in_qkv = args.combine_norm_in_qkv;
  o.mma_expert_gemv = args.mma_gemv;
  if (args.min_split_keys > 0) o.decode_attention_min_split_keys = args.min_split_keys;
  o.combine_in_down = args.combine_in_down;
  o.w8a8_linear = args.w8a8_linear;
  o.tma_experts = args.tma_experts;
  o.router_norm = args.router_norm;
  const double lin = linear_bytes_per_param(args.quant);
  auto t0 = Clock::now();
  CudaBackend be(cfg, 20261129, o);
  const double load_s = seconds_since(t0);
  std::printf("%s\nweights: %.1f GB per GPU generated in %.2f s; copy bandwidth %.2f TB/s (cuda:%d)\n",
              be.info().description.c_str(), be.memory_plan().weights / 1e9, load_s, bw / 1e12,
              o.device_list()[0]);
  for (int r = 0; r < args.tp; ++r) {
    const MemoryPlan& m = be.memory_plan(r);
    std::printf("  %s: weights %.2f GiB, activations %.2f GiB, KV %.2f GiB (%lld blocks)\n",
                m.device.c_str(), m.weights / 1073741824.0, m.activations / 1073741824.0,
                m.kv / 1073741824.0, static_cast<long long>(m.kv_blocks));
  }

  nlohmann::json J;
  J["copy_bandwidth_Bps"] = bw;
  J["params"] = P.total;
  J["shape"] = args.shape;
  J["backend"] = be.info().description;
  J["tensor_parallel_size"] = args.tp;
  J["expert_parallel"] = args.ep;
  J["custom_all_reduce"] = args.custom_all_reduce;
  J["quantization"] = quantization_name(args.quant);
  J["moe_sorted_min_rows_per_expert"] = o.moe_sorted_min_rows_per_expert;
  J["wgmma_experts"] = o.wgmma_experts;
  J["w8a8_experts"] = o.w8a8_experts;
  J["stream_gemv"] = o.stream_gemv;
  J["wgmma_attention"] = o.wgmma_attention;
  J["fused_rope_attention"] = o.fused_rope_attention;
  J["prefill_rope_q"] = o.prefill_rope_q;
  J["cluster_attention_merge"] = o.cluster_attention_merge;
  J["cluster_router"] = o.cluster_router;
  J["pdl_trigger_early"] = o.pdl_trigger_early;
  J["combine_norm_in_qkv"] = o.combine_norm_in_qkv;
  J["mma_expert_gemv"] = o.mma_expert_gemv;
  J["decode_attention_min_split_keys"] = o.decode_attention_min_split_keys;
  J["combine_in_down"] = o.combine_in_down;
  J["w8a8_linear"] = o.w8a8_linear;
  J["tma_experts"] = o.tma_experts;
  J["router_norm"] = o.router_norm;
  J["memory_plan"] = {{"weights", be.memory_plan().weights},
                      {"activations", be.memory_plan().activations},
                      {"kv", be.memory_plan().kv},
                      {"kv_blocks", be.memory_plan().kv_blocks}};
  std::mt19937 rng(7);
  struct Row {
    int batch;
    double prefill_tok_s, prefill_roof_tok_s, step_ms, roof_ms, tok_s, peer_step_ms;
    double eager_ms, all_reduce_ms, gather_ms;
  };
  std::vector<Row> rows;
  // MOEBATCH_BENCH_BATCHES=1 (comma list) limits the batches, e.g. for a profiler run.
  std::vector<int> batches{1, 64, 256};
  if (const char* env = std::getenv("MOEBATCH_BENCH_BATCHES")) {
    batches.clear();
    std::stringstream ss(env);
    for (std::string item; std::getline(ss, item, ',');) batches.push_back(std::stoi(item));
  }
  // Where a prefill's time goes: one eager run with CUDA events per stage, printed and returned.
  auto print_prefill_stages = [&](const StepBatch& prefill, int prompts, int len) {
    nlohmann::json pst = nlohmann::json::object();
    double ptotal = 0;
    const auto stages = be.profile(prefill);
    for (auto& [name, t] : stages) ptotal += t;
    std::printf("\n%d x %d tokens: prefill by stage (CUDA events, summed over layers):\n", prompts, len);
    for (auto& [name, t] : stages) {
      pst[name] = t;
      std::printf("  %-22s %8.3f ms  %5.1f%%\n", name.c_str(), t, 100 * t / ptotal);
    }
    return pst;
  };
  // A prefill's seconds: once to warm up (the same k/v are rewritten), then timed.
  auto time_prefill = [&](const Seqs& s, std::vector<RowSampling>& greedy, std::vector<int32_t>& next) {
    be.forward_sample(s.prefill, greedy, next, nullptr);
    const auto start = Clock::now();
    be.forward_sample(s.prefill, greedy, next, nullptr);
    return seconds_since(start);
  };
  for (int batch : batches) {
    const int width = (kPrompt + kWarmSteps + kTimedSteps + 16) / 16 + 1;
    Seqs s = make_prompts(batch, cfg.vocab_size, width, rng);
    std::vector<RowSampling> greedy(batch);
    std::vector<int32_t> next;
    const double prefill_s = time_prefill(s, greedy, next);
    const double ptoks = double(batch) * kPrompt;
    // where a prefill's time goes (one eager run with CUDA events per stage)
    nlohmann::json pst = nlohmann::json::object();
    if (batch == 64) pst = print_prefill_stages(s.prefill, batch, kPrompt);
    // prefill roofline: FLOPs of the weights each token uses (attention scores not counted), or
    // every weight read once
    const double active = P.mixers + cfg.num_layers * (P.router_layer + cfg.num_experts_per_tok * P.expert +
                                                       P.shared_layer);
    const double pflops = 2.0 * ptoks * active + 2.0 * batch * P.lm_head;
    const double pbytes = lin * (P.mixers + cfg.num_layers * (cfg.num_experts * P.expert + P.shared_layer)) +
                          2.0 * (cfg.num_layers * P.router_layer + P.lm_head);
    const double proof_s = std::max(pflops / kGemmPeakFlops, pbytes / bw) / args.tp;
    // decode: warm steps (first step of a shape runs eagerly and captures its graph), then timed
    int pos = kPrompt;
    for (int i = 0; i < kWarmSteps; ++i, ++pos) be.forward_sample(decode_step(s, next, pos), greedy, next, nullptr);
    std::vector<double> ms;
    for (int i = 0; i < kTimedSteps; ++i, ++pos) {
      StepBatch b = decode_step(s, next, pos);
      t0 = Clock::now();
      be.forward_sample(b, greedy, next, nullptr);
      ms.push_back(seconds_since(t0) * 1e3);
    }
    // One more graph-replayed step inside a profiler range (ncu --profile-from-start off sees
    // only it; without a profiler the range is a no-op).
    (void)kernels::take_step_trace();  // (diagnostic builds) only this step's kernels below
    CUDA_CHECK(cudaProfilerStart());
    be.forward_sample(decode_step(s, next, pos++), greedy, next, nullptr);
    CUDA_CHECK(cudaProfilerStop());
    print_step_trace(kernels::take_step_trace(), static_cast<int>(cfg.num_layers));
    std::sort(ms.begin(), ms.end());
    const double step_ms = ms[ms.size() / 2];
    const int ctx = pos - kTimedSteps / 2;
    const double roof_ms = decode_bytes(cfg, P, batch, ctx, lin) / bw * 1e3 / args.tp;
    auto stages = be.profile(decode_step(s, next, pos));
    double peer_ms = 0;
    const std::string key = std::to_string(batch);
    if (peer.is_object() && peer.contains("decode_step_ms") && peer["decode_step_ms"].contains(key))
      peer_ms = peer["decode_step_ms"][key].get<double>();
    nlohmann::json st = nlohmann::json::object();
    double total = 0;
    for (auto& [name, t] : stages) {
      st[name] = t;
      total += t;
    }
    // the fused stage includes the add + norm the NCCL path runs as its own stage
    const double ar_ms = stage_ms(stages, "all_reduce") + stage_ms(stages, "all_reduce_add_norm");
    const double gather_ms = stage_ms(stages, "lm_head_gather");
    rows.push_back({batch, ptoks / prefill_s, ptoks / proof_s, step_ms, roof_ms,
                    batch / (step_ms * 1e-3), peer_ms, total, ar_ms, gather_ms});
    J["batches"][key] = {{"prefill_s", prefill_s},
                         {"prefill_stage_ms", pst},
                         {"prefill_tok_s", ptoks / prefill_s},
                         {"prefill_roofline_tok_s", ptoks / proof_s},
                         {"decode_step_ms_median", step_ms},
                         {"decode_step_ms_min", ms.front()},
                         {"decode_step_ms_max", ms.back()},
                         {"decode_tok_s", batch / (step_ms * 1e-3)},
                         {"decode_context", ctx},
                         {"decode_roofline_ms", roof_ms},
                         {"decode_bytes", decode_bytes(cfg, P, batch, ctx, lin)},
                         {"eager_stage_ms", st},
                         {"eager_stage_total_ms", total},
                         {"eager_all_reduce_ms", ar_ms},
                         {"all_reduces_per_step", args.tp > 1 ? 2 * cfg.num_layers : 0},
                         {"eager_lm_head_gather_ms", gather_ms},
                         {"peer_step_ms", peer_ms}};
    std::printf("\nbatch %d: eager decode step by stage (CUDA events, summed over 48 layers):\n", batch);
    for (auto& [name, t] : stages) std::printf("  %-18s %8.3f ms  %5.1f%%\n", name.c_str(), t, 100 * t / total);
    std::printf("  %-18s %8.3f ms\n", "total (eager)", total);
  }
  // Long prompts, the users' workload: 8 prompts of 1024 tokens in one forward (attention grows
  // with the prompt; the expert and projection GEMMs see the same 8192 rows as 64 × 128).
  double long_prefill_tok_s = 0;
  if (o.max_num_batched_tokens >= kLongPrompts * kLongPrompt) {
    Seqs s = make_prompts(kLongPrompts, cfg.vocab_size, kLongPrompt / 16, rng, kLongPrompt);
    std::vector<RowSampling> greedy(kLongPrompts);
    std::vector<int32_t> next;
    long_prefill_tok_s = double(kLongPrompts) * kLongPrompt / time_prefill(s, greedy, next);
    J["prefill_8x1024_tok_s"] = long_prefill_tok_s;
    J["prefill_8x1024_stage_ms"] = print_prefill_stages(s.prefill, kLongPrompts, kLongPrompt);
  }
  J["graphs_captured"] = be.num_graphs();
  if (peer.is_object()) J["peer"] = peer;
  std::ofstream(args.out_path) << J.dump(2) << "\n";

  std::printf("\n%s shape, random weights (linear: %s), %dx GPU%s, prompts of %d tokens\n", args.shape.c_str(),
              args.quant == Quantization::None ? "bf16" : quantization_name(args.quant), args.tp,
              args.tp > 1 ? (args.ep ? " expert parallel" : " tensor parallel") : "", kPrompt);
  std::printf("%6s | %12s %12s | %10s %10s %6s %10s | %9s %9s %9s | %10s %8s\n", "batch",
              "prefill t/s", "roof t/s", "step ms", "roof ms", "%roof", "decode t/s", "eager ms",
              "AR ms", "gather ms", "HF ms", "x HF");
  for (const Row& r : rows) {
    std::printf("%6d | %12.0f %12.0f | %10.3f %10.3f %5.0f%% %10.0f | %9.3f %9.3f %9.3f | %10.1f %8.1f\n",
                r.batch, r.prefill_tok_s, r.prefill_roof_tok_s, r.step_ms, r.roof_ms,
                100 * r.roof_ms / r.step_ms, r.tok_s, r.eager_ms, r.all_reduce_ms, r.gather_ms,
                r.peer_step_ms, r.peer_step_ms > 0 ? r.peer_step_ms / r.step_ms : 0.0);
  }
  if (long_prefill_tok_s > 0)
    std::printf("prefill of %d prompts of %d tokens: %.0f tok/s\n", kLongPrompts, kLongPrompt, long_prefill_tok_s);
  if (args.tp > 1)
    std::printf("AR ms: the %lld all-reduces of one eager decode step on cuda:%d's stream (incl. "
                "waiting for the peers; peer-to-peer ones include the add + RMSNorm fused into "
                "them); gather ms: the vocab-parallel lm_head all-gather\n",
                static_cast<long long>(2 * cfg.num_layers), o.device_list()[0]);
  return 0;
}
