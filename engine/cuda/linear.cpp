#include "engine/cuda/linear.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "kernels/gemm.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/quant.cuh"

namespace moebatch {
namespace {

[[noreturn]] void no_kernel(const char* op, WeightFormat f) {
  throw Error(std::string(op) + ": no CUDA kernel for weights stored as " + weight_format_name(f));
}

// Where W8A8 loses to decoding the weight for a bf16 GEMM (bench/RESULTS.md 2026-12-03,
// session 14, 30B shape, eager stages over 48 layers): at prefill size the activation pass of a
// wide input costs more than the FP8 rate saves — o_proj (k 4096) at 8192 rows 9.57 vs 8.29 ms —
// while qkv (k 2048) wins there (9.22 vs 10.92) and both win at 64 and 256 rows (qkv 0.83 vs
// 1.08 / 0.91 vs 1.27, o_proj 0.98 vs 1.04 / 1.09 vs 1.15). Between 256 and 8192 rows not measured.
constexpr int kW8a8WideInputMaxRows = 1024, kW8a8WideInput = 2048;

// W8A8 through cuBLASLt's block-scaled FP8 GEMM: rows in multiples of four (its activation
// scales' pitch), the last rows % 4 on the decode GEMV with bf16 activations. False when the
// call is not one it takes (then the caller's other paths run).
bool linear_w8a8(const GemmContext& g, bf16* out, const bf16* in, const DeviceTensor& w, int rows) {
  const int n = static_cast<int>(w.shape[0]), k = static_cast<int>(w.shape[1]);
  const int m4 = rows / 4 * 4;
  if (k > kW8a8WideInput && rows > kW8a8WideInputMaxRows) return false;
  if (g.fp8_gemm == nullptr || w.block_scales == nullptr || rows <= kernels::kGemvMaxRows ||
      fp8_rows_bytes(m4, k) > g.a8_bytes)
    return false;
  const Fp8Rows x = carve_fp8_rows(g.a8, g.a8_bytes, m4, k);
  if (!g.fp8_gemm->supports(m4, n, k, out, x.data, w.data)) return false;
  kernels::quantize_fp8_rows(in, m4, k, kernels::kFp8BlockGemmGroup, x.data, x.scales, g.stream, 1, m4);
  g.fp8_gemm->run(g.stream, out, x.data, x.scales, static_cast<const uint8_t*>(w.data), w.block_scales, m4, n, k);
  if (rows > m4)
    kernels::gemv_quant(out + static_cast<size_t>(m4) * n, in + static_cast<size_t>(m4) * k, w.matrix(),
                        rows - m4, n, k, g.stream);
  return true;
}

template <class Out>
void linear_any(const GemmContext& g, Out* out, const bf16* in, const DeviceTensor& w, int rows) {
  MB_CHECK(w.shape.size() == 2, "linear: weight must be [out, in]");
  const int n = static_cast<int>(w.shape[0]), k = static_cast<int>(w.shape[1]);
  if (w.format == WeightFormat::F32) no_kernel("linear", w.format);
  if constexpr (std::is_same_v<Out, bf16>)
    if (w.format == WeightFormat::Fp8Block && linear_w8a8(g, out, in, w, rows)) return;
  if (linear_on_gemv_stream(g, w, rows)) {
    kernels::gemv_stream(out, in, w.as_bf16(), rows, n, k, g.stream, g.pdl_trigger_early);
    return;
  }
  // bf16: cuBLAS; compressed: the decode GEMV for few rows, else decoded into the scratch once
  // and cuBLAS (kernels::quant_linear_path is the one place that chooses)
  kernels::quant_linear(g.cublas, g.stream, out, in, w.matrix(), rows, n, k, g.scratch,
                        g.scratch_elems);
}

// Experts of a compressed stack decoded per grouped GEMM on the many-token path: enough to keep
// the GEMM wide, a bounded scratch (30B shape: 32 × 6 MiB).
constexpr int64_t kDequantExperts = 32;

}  // namespace

bool linear_on_gemv_stream(const GemmContext& g, const DeviceTensor& w, int rows) {
  return g.stream_gemv && w.format == WeightFormat::Bf16 && w.shape.size() == 2 && rows == 1 &&
         kernels::gemv_stream_fits(rows, static_cast<int>(w.shape[1]));
}

void linear(const GemmContext& g, bf16* out, const bf16* in, const DeviceTensor& w, int rows) {
  linear_any(g, out, in, w, rows);
}

void linear(const GemmContext& g, float* out, const bf16* in, const DeviceTensor& w, int rows) {
  linear_any(g, out, in, w, rows);
}

// Decode batches up to this many tokens take the grouped GEMV. Measured on the 30B shape
// (bench/RESULTS.md, 2026-12-01): at 1 token it beats the tiled GEMM (gate+up 22 vs 26 µs bf16,
// 17 vs 26 µs fp8); at 8 tokens (~56 experts hit) the tiled GEMM streams the larger byte count
// closer to the copy bandwidth. 2 and 4 are not yet measured.
constexpr int kExpertGemvMaxTokens = 1;

void expert_gemm(const GemmContext& g, kernels::MoeGemmParams p, const DeviceTensor& w, int tokens) {
  MB_CHECK(w.shape.size() == 3 && w.shape[0] == p.num_experts &&
               w.shape[1] == (p.silu_gate_up ? 2 : 1) * p.n && w.shape[2] == p.k,
           "expert_gemm: weights must be [num_experts, n (2n with silu_gate_up), k]");
  switch (w.format) {
    case WeightFormat::Bf16:
    case WeightFormat::Fp8Block:
    case WeightFormat::Nvfp4:
    case WeightFormat::Int8:
    case WeightFormat::Int4:
      p.weight = w.matrix();  // both kernels decode each codec in registers
      if (tokens <= kExpertGemvMaxTokens && p.active_experts != nullptr)
        kernels::moe_gemv(p, tokens, g.stream);
      else if (g.tma_experts && kernels::moe_gemm_tma_takes(p))
        kernels::moe_gemm_tma(p, g.stream);
      else
        kernels::moe_gemm(p, g.stream);
      return;
    case WeightFormat::F32:
      break;
  }
  no_kernel("expert_gemm", w.format);
}

bool expert_gemv_combine(const GemmContext& g, kernels::MoeGemmParams p, const DeviceTensor& w, bf16* residual,
                         const float* weights) {
  if (w.format == WeightFormat::F32 || !kernels::moe_gemv_combine_takes(p)) return false;
  MB_CHECK(w.shape.size() == 3 && w.shape[0] == p.num_experts && w.shape[1] == p.n && w.shape[2] == p.k,
           "expert_gemv_combine: weights must be [num_experts, n, k]");
  p.weight = w.matrix();
  kernels::moe_gemv_combine(p, residual, weights, g.stream);
  return true;
}

namespace {

// A many-token expert stage's weights: the stack's [experts, n, k] and how many of its experts
// one batch takes (compressed stacks are decoded into the scratch a batch at a time, then
// multiplied like bf16; bf16 stacks are one batch).
struct ExpertStack {
  int experts, n, k, per_batch;
  bool packed;
  size_t expert_elems() const { return static_cast<size_t>(n) * k; }
};

ExpertStack expert_stack(const GemmContext& g, const DeviceTensor& w, const std::string& op) {
  MB_CHECK(w.shape.size() == 3, op + ": weights must be [num_experts, n, k]");
  MB_CHECK(w.format != WeightFormat::F32, op + ": no CUDA kernel for f32 weights");
  ExpertStack s{static_cast<int>(w.shape[0]), static_cast<int>(w.shape[1]), static_cast<int>(w.shape[2]), 0,
                w.format != WeightFormat::Bf16};
  s.per_batch = s.packed ? static_cast<int>(std::min<size_t>(g.scratch_elems / s.expert_elems(), s.experts))
                         : s.experts;
  MB_CHECK(s.per_batch > 0, op + ": scratch smaller than one expert");
  return s;
}

}  // namespace

void expert_gemm_sorted(const GemmContext& g, bf16* out, const bf16* in, const DeviceTensor& w,
                        const int32_t* offsets, int stage) {
  const ExpertStack st = expert_stack(g, w, "expert_gemm_sorted");
  const int experts = st.experts, n = st.n, k = st.k;
  MB_CHECK(stage >= 0 && stage < kGroupedStages && experts <= g.group_cap,
           "expert_gemm_sorted: pointer staging too small");
  const size_t expert_elems = st.expert_elems();
  std::vector<bf16*> outs;
  std::vector<const bf16*> xs, ws;
  std::vector<int> ms;
  // Each batch stages its pointers past the previous batch's (still being copied) in the stage's
  // region of 3 · group_cap entries; the batches of a stage hold at most `experts` problems.
  size_t staged = static_cast<size_t>(stage) * 3 * g.group_cap;
  auto flush = [&] {
    const int count = static_cast<int>(ms.size());
    kernels::linear_grouped(g.cublas, g.stream, outs.data(), xs.data(), ws.data(), ms.data(), count,
                            n, k, g.group_ptrs_host + staged, g.group_ptrs_dev + staged);
    staged += 3 * static_cast<size_t>(count);
    outs.clear();
    xs.clear();
    ws.clear();
    ms.clear();
  };
  for (int e = 0; e < experts; ++e) {
    const int row0 = offsets[e], rows = offsets[e + 1] - offsets[e];
    MB_CHECK(row0 >= 0 && rows >= 0, "expert_gemm_sorted: bad expert offsets");
    if (rows == 0) continue;
    const bf16* weight = nullptr;
    if (st.packed) {
      bf16* slot = g.scratch + ms.size() * expert_elems;
      kernels::dequantize(w.rows_from(static_cast<int64_t>(e) * n).matrix(), n, k, slot, g.stream);
      weight = slot;
    } else {
      weight = w.as_bf16() + static_cast<size_t>(e) * expert_elems;
    }
    outs.push_back(out + static_cast<size_t>(row0) * n);
    xs.push_back(in + static_cast<size_t>(row0) * k);
    ws.push_back(weight);
    ms.push_back(rows);
    if (static_cast<int>(ms.size()) == st.per_batch) flush();
  }
  if (!ms.empty()) flush();
}

void expert_gemm_wgmma(const GemmContext& g, kernels::MoeWgmmaParams p, const DeviceTensor& w) {
  const ExpertStack st = expert_stack(g, w, "expert_gemm_wgmma");
  MB_CHECK(p.num_experts == st.experts && p.n == st.n && p.k == st.k,
           "expert_gemm_wgmma: operands and weights disagree");
  if (!st.packed) {
    p.weight = w.as_bf16();
    kernels::moe_wgmma(p, g.stream);
    return;
  }
  const int32_t* offsets = p.expert_offsets;
  for (int e0 = 0; e0 < st.experts; e0 += st.per_batch) {
    const int count = std::min(st.per_batch, st.experts - e0);
    kernels::dequantize(w.rows_from(static_cast<int64_t>(e0) * st.n).matrix(),
                        static_cast<int64_t>(count) * st.n, st.k, g.scratch, g.stream);
    p.weight = g.scratch;
    p.expert_offsets = offsets + e0;  // absolute row offsets: the slice's rows stay where they are
    p.num_experts = count;
    kernels::moe_wgmma(p, g.stream);
  }
}

namespace {
size_t fp8_values_bytes(int64_t rows, int cols) {
  return (static_cast<size_t>(rows) * cols + 255) / 256 * 256;  // the scales after them stay aligned
}
}  // namespace

size_t fp8_rows_bytes(int64_t rows, int cols) {
  const int64_t groups = (cols + kernels::kWgmmaFp8Group - 1) / kernels::kWgmmaFp8Group;
  return fp8_values_bytes(rows, cols) + static_cast<size_t>(rows) * groups * sizeof(float);
}

Fp8Rows carve_fp8_rows(void* buf, size_t bytes, int64_t rows, int cols) {
  MB_CHECK(rows >= 0 && cols > 0, "carve_fp8_rows: bad shape");
  MB_CHECK(fp8_rows_bytes(rows, cols) <= bytes,
           "carve_fp8_rows: the buffer is too small for the e4m3 rows and their scales");
  uint8_t* data = static_cast<uint8_t*>(buf);
  return {data, reinterpret_cast<float*>(data + fp8_values_bytes(rows, cols))};
}

namespace {
// The rule behind both w8a8_experts overloads: it reads only shape, format and group, which a
// plan and the tensor loaded from it share.
template <class Tensor>
bool w8a8_stacks(const Tensor& gate_up, const Tensor& down) {
  auto fits = [](const Tensor& w, int64_t out_cols) {
    return w.shape.size() == 3 && w.format == WeightFormat::Fp8Block &&
           w.group == kernels::kWgmmaFp8Group && w.shape[2] % 16 == 0 && out_cols % 16 == 0;
  };
  return !gate_up.empty() && !down.empty() && fits(gate_up, gate_up.shape[1] / 2) &&
         fits(down, down.shape[1]);
}
}  // namespace

bool w8a8_experts(const DeviceTensor& gate_up, const DeviceTensor& down) {
  return w8a8_stacks(gate_up, down);
}

bool w8a8_experts(const TensorPlan& gate_up, const TensorPlan& down) {
  return w8a8_stacks(gate_up, down);
}

bool expert_gemm_w8a8(const DeviceTensor& gate_up, const DeviceTensor& down, int tokens) {
  return tokens > kExpertGemvMaxTokens && w8a8_stacks(gate_up, down) &&
         gate_up.shape[2] % kernels::kMoeGemmA8Group == 0 && down.shape[2] % kernels::kMoeGemmA8Group == 0;
}

void expert_gemm_wgmma_fp8(const GemmContext& g, kernels::MoeWgmmaFp8Params p, const DeviceTensor& w) {
  MB_CHECK(w.shape.size() == 3 && w.format == WeightFormat::Fp8Block && w.group == kernels::kWgmmaFp8Group,
           "expert_gemm_wgmma_fp8: weights must be FP8 blocks of 128 inputs");
  MB_CHECK(p.num_experts == w.shape[0] && p.n == w.shape[1] && p.k == w.shape[2],
           "expert_gemm_wgmma_fp8: operands and weights disagree");
  p.weight = static_cast<const uint8_t*>(w.data);
  p.weight_scales = static_cast<const float*>(w.scales);
  p.weight_scale_rows = w.scale_rows;
  kernels::moe_wgmma_fp8(p, g.stream);
}

size_t w8a8_linear_bytes(const ModelPlan& plan, int64_t rows) {
  size_t most = 0;
  auto consider = [&](const TensorPlan& t) {
    if (t.empty() || t.shape.size() != 2 || t.format != WeightFormat::Fp8Block) return;
    const int k = static_cast<int>(t.shape[1]);
    // the rows linear_w8a8 sends through the buffer at most
    const int64_t takes = k > kW8a8WideInput ? std::min<int64_t>(rows, kW8a8WideInputMaxRows) : rows;
    most = std::max(most, fp8_rows_bytes(takes, k));
  };
  for (const auto& L : plan.layers)
    for (const TensorPlan* t : {&L.wqkv, &L.wo, &L.mlp_gate_up, &L.mlp_down, &L.shared_gate_up, &L.shared_down,
                                &L.lin_in, &L.lin_out})
      consider(*t);
  return most;
}

size_t dequant_scratch_elems(const ModelPlan& plan) {
  size_t most = 0;
  auto consider = [&](const TensorPlan& t) {
    if (!t.empty() && t.shape.size() == 2 && t.format != WeightFormat::Bf16)
      most = std::max(most, static_cast<size_t>(t.numel()));
  };
  for (const auto& L : plan.layers) {
    for (const TensorPlan* t : {&L.wqkv, &L.wo, &L.mlp_gate_up, &L.mlp_down, &L.router,
                                &L.shared_gate_up, &L.shared_down, &L.shared_gate})
      consider(*t);
    // expert_gemm_sorted / expert_gemm_wgmma decode up to kDequantExperts experts of a stack at a time
    for (const TensorPlan* t : {&L.w_gate_up, &L.w_down})
      if (!t->empty() && t->format != WeightFormat::Bf16)
        most = std::max(most, static_cast<size_t>(std::min<int64_t>(t->shape[0], kDequantExperts) *
                                                  t->shape[1] * t->shape[2]));
  }
  consider(plan.lm_head);
  return most;
}

}  // namespace moebatch
