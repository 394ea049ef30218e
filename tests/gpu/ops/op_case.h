// Kernel op cases in the manner of llama.cpp's tests/test-backend-ops.cpp: one definition per
// (op, shapes, weight format) gives both the correctness check against a CPU reference (the GPU
// tests, tests/gpu/test_op_cases.cpp) and the timing with its bytes and flops (the kernel
// benchmark, bench/gpu/bench_kernels.cpp). A new kernel or weight format adds cases here and gets
// both. Per-family shapes and case factories: op_shapes.h; the two tables: op_table.cpp.
//
// A case's life: setup (fresh random inputs from a seed, outputs poisoned with NaN) → run (one
// launch on the stream; the benchmark repeats it) → check (CPU reference, fp64 unless stated,
// compared as ‖out − ref‖ / ‖ref‖ ≤ tol with every element finite, plus the op's exact checks).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moebatch::ops {

/// Kernel family: one per kernels/<family>.cuh.
enum class OpFamily {
  embedding, rmsnorm, rope, kv_cache, attention, moe_routing, moe_gemm, moe_ops, gemm, sampling, quant, linear_attention
};
const char* op_family_name(OpFamily f);

/// Storage format of a case's weights (activations stay bf16), as kernels/weight_codec.cuh lays
/// them out; the weight-taking cases (moe_gemm, linear) dispatch on it in one place (random
/// packed weights and their decoded reference: tests/gpu/ops/quant_util.h) and refuse a format
/// they do not implement.
/// int8: codes with f32 scale and min per 16 (GGUF Q6_K-like); int4: per 32 (Q4_K-like).
enum class WeightFormat { bf16, fp8_block, nvfp4, int8, int4 };
const char* weight_format_name(WeightFormat f);

/// What a case runs with. The caller owns all of it.
struct OpEnv {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;  ///< needed by the gemm and quant families (cuBLAS paths) only
  int num_sms = 0;                  ///< for heuristics that size grids (attention splits)
};

/// Outcome of a case's comparison with its reference: every sub-check appends one line to
/// detail(); ok() is false once any failed.
class OpCheck {
 public:
  bool ok() const { return ok_; }
  const std::string& detail() const { return detail_; }
  /// ‖out − ref‖ / ‖ref‖ ≤ tol, and every element of out finite (NaN never passes).
  void rel_l2(std::string_view what, const std::vector<float>& out, const std::vector<double>& ref, double tol);
  /// Element-wise equality (bit-exact copies, ids); names the first differing index.
  void equal(std::string_view what, const std::vector<int32_t>& got, const std::vector<int32_t>& want);
  void equal(std::string_view what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want);
  void equal(std::string_view what, const std::vector<float>& got, const std::vector<float>& want);
  /// A named condition (structure: padding, sentinels, counters).
  void expect(bool cond, std::string_view what);

 private:
  void add(bool pass, std::string line);
  bool ok_ = true;
  std::string detail_;
};

/// One live case: its device buffers and host-side state. Made fresh by OpCaseDef::make.
class OpCase {
 public:
  virtual ~OpCase() = default;
  /// Allocates device buffers, fills fresh random inputs from `seed` (every draw comes from it)
  /// and poisons the outputs with NaN / -1.
  virtual void setup(const OpEnv& env, uint32_t seed) = 0;
  /// Launches the op on env.stream. Cases with several input sets (the expert GEMMs rotate over
  /// routings so the benchmark does not time L2 hits) use set iter % count.
  virtual void run(const OpEnv& env, int iter) = 0;
  /// After setup, one run(env, 0) and a stream sync (run_and_check): CPU reference and compare.
  virtual OpCheck check(const OpEnv& env, double tol) = 0;
  /// Bytes one run must move through HBM, and its flops (after setup: may depend on routing).
  virtual double bytes() const = 0;
  virtual double flops() const { return 0; }
  /// After setup: a choice made at run time worth printing ("splits 8", "experts hit 7.9").
  virtual std::string note() const { return {}; }
};

/// A row of a table: what the case is, and how to make it.
struct OpCaseDef {
  std::string name;   ///< op label; the benchmark's kernel column ("moe_gemm down")
  std::string shape;  ///< shape parameters in words ("t12 E32 k8 H2048 I768 hot7")
  OpFamily family = OpFamily::embedding;
  WeightFormat format = WeightFormat::bf16;
  double tol = 0;     ///< relative L2 bound vs the CPU reference (sampling: draw-boundary slack); 0: exact only
  int batch = 0;      ///< benchmark tables: the decode batch (tokens) the shapes stand for
  std::function<std::unique_ptr<OpCase>()> make;  ///< no device work: safe at test registration
  /// Whether the op runs on `device` at all (a kernel built for one architecture); null: always.
  /// The tests skip a row that is not, the benchmark leaves it out.
  bool (*available)(int device) = nullptr;
};

/// The same definition under another label (benchmark names: "lm_head (cuBLAS)").
OpCaseDef named(OpCaseDef def, std::string name);

/// A row (format bf16; weight-taking factories set theirs) whose make() builds Case from a copy
/// of its shape.
template <typename Case, typename Shape>
OpCaseDef op_case_def(std::string name, std::string shape, OpFamily family, double tol, const Shape& s) {
  OpCaseDef d;
  d.name = std::move(name);
  d.shape = std::move(shape);
  d.family = family;
  d.tol = tol;
  d.make = [s] { return std::make_unique<Case>(s); };
  return d;
}

/// The correctness table: small and edge-case shapes, each checked by the GPU tests.
std::vector<OpCaseDef> op_cases_test();
/// The benchmark table: Qwen3-30B-A3B shapes at decode batch 1, 64 and 256, then prefill
/// attention, then Qwen3-Next-80B's Gated DeltaNet kernels; their references are costly (run by
/// moebatch_bench_kernels --check).
std::vector<OpCaseDef> op_cases_bench();

/// run(env, 0), sync, check(env, tol): the one path the tests, the benchmark and the lab check by.
OpCheck run_and_check(OpCase& c, const OpEnv& env, double tol);

/// Median milliseconds of `iters` launches of fn(i), CUDA events around each, after `warmup`
/// untimed ones.
double median_ms(cudaStream_t stream, const std::function<void(int)>& fn, int warmup, int iters);
/// The same for a case's run().
double op_case_median_ms(OpCase& c, const OpEnv& env, int warmup = 5, int iters = 40);

}  // namespace moebatch::ops
