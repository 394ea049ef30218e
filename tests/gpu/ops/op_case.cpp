#include "tests/gpu/ops/op_case.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "kernels/cuda_check.cuh"
#include "tests/gpu/ops/op_util.h"

namespace moebatch::ops {
namespace {

std::string sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

template <typename T>
std::string show(T v) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%04x", static_cast<unsigned>(v));
    return b;
  } else {
    return std::to_string(v);
  }
}

template <typename T>
std::string compare_equal(std::string_view what, const std::vector<T>& got, const std::vector<T>& want, bool& pass) {
  std::string line(what);
  pass = false;
  if (got.size() != want.size())
    return line + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  size_t first = got.size(), bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {  // float: NaN never equals, -0 equals 0
      if (bad++ == 0) first = i;
    }
  if (bad == 0) {
    pass = true;
    return line + ": exact (" + std::to_string(got.size()) + ")";
  }
  return line + ": " + std::to_string(bad) + " of " + std::to_string(got.size()) + " differ, first at " +
         std::to_string(first) + ": got " + show(got[first]) + " want " + show(want[first]);
}

}  // namespace

const char* op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::embedding: return "embedding";
    case OpFamily::rmsnorm: return "rmsnorm";
    case OpFamily::rope: return "rope";
    case OpFamily::kv_cache: return "kv_cache";
    case OpFamily::attention: return "attention";
    case OpFamily::moe_routing: return "moe_routing";
    case OpFamily::moe_gemm: return "moe_gemm";
    case OpFamily::moe_ops: return "moe_ops";
    case OpFamily::gemm: return "gemm";
    case OpFamily::sampling: return "sampling";
    case OpFamily::quant: return "quant";
    case OpFamily::linear_attention: return "linear_attention";
  }
  return "?";
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::fp8_block: return "fp8";
    case WeightFormat::nvfp4: return "nvfp4";
    case WeightFormat::int8: return "int8";
    case WeightFormat::int4: return "int4";
  }
  return "?";
}

void OpCheck::add(bool pass, std::string line) {
  ok_ = ok_ && pass;
  if (!detail_.empty()) detail_ += "; ";
  detail_ += pass ? line : "FAIL " + line;
}

void OpCheck::rel_l2(std::string_view what, const std::vector<float>& out, const std::vector<double>& ref, double tol) {
  std::string line(what);
  if (out.size() != ref.size())
    return add(false, line + ": size " + std::to_string(out.size()) + " != " + std::to_string(ref.size()));
  size_t bad = 0;
  const double rel = rel_l2_error(out, ref, bad);
  if (rel < 0) return add(false, line + ": non-finite output at " + std::to_string(bad) + " (unwritten?)");
  add(rel <= tol, line + ": relative L2 error " + sci(rel) + (rel <= tol ? " <= " : " > ") + sci(tol));
}

void OpCheck::equal(std::string_view what, const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  bool pass;
  std::string line = compare_equal(what, got, want, pass);
  add(pass, std::move(line));
}
void OpCheck::equal(std::string_view what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  bool pass;
  std::string line = compare_equal(what, got, want, pass);
  add(pass, std::move(line));
}
void OpCheck::equal(std::string_view what, const std::vector<float>& got, const std::vector<float>& want) {
  bool pass;
  std::string line = compare_equal(what, got, want, pass);
  add(pass, std::move(line));
}

void OpCheck::expect(bool cond, std::string_view what) {
  if (!cond) add(false, std::string(what));
}

OpCaseDef named(OpCaseDef def, std::string name) {
  def.name = std::move(name);
  return def;
}

OpCheck run_and_check(OpCase& c, const OpEnv& env, double tol) {
  // The setup's kernels complete first, as a forward's inputs do: some kernels read step inputs
  // before their pdl_sync (kernels/launch.cuh), which a setup kernel just before would race.
  CUDA_CHECK(cudaStreamSynchronize(env.stream));
  c.run(env, 0);
  CUDA_CHECK(cudaStreamSynchronize(env.stream));
  return c.check(env, tol);
}

double median_ms(cudaStream_t stream, const std::function<void(int)>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    fn(i);
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&t[i], a, b));
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[iters / 2];
}

double op_case_median_ms(OpCase& c, const OpEnv& env, int warmup, int iters) {
  return median_ms(env.stream, [&](int i) { c.run(env, i); }, warmup, iters);
}

}  // namespace moebatch::ops
