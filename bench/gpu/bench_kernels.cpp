// Per-kernel timings on Qwen3-30B-A3B shapes (hidden 2048, 32 q / 4 kv heads of 128, 128 experts
// top-8, moe_intermediate 768, vocab 151936) at batch 1, 64 and 256, then prefill attention: the
// benchmark rows of the op-case table (tests/gpu/ops/op_table.cpp), i.e. the same case
// definitions the GPU tests check. CUDA events around each launch, median of 40 after 5 warmup
// runs, random data (never zeros) from seeds; the expert GEMMs rotate over several routings so
// repeated runs do not just re-read L2. Beside them: the device copy ceiling and a cuBLAS batched
// GEMM on the expert shapes as a peer.
// Usage: moebatch_bench_kernels [out.json] [--check] [--filter TEXT]
//   --check        compare each case with its CPU reference once before timing (slow: the
//                  references of the large shapes take minutes on a few cores)
//   --filter TEXT  only the rows whose kernel name contains TEXT
// A build with -DMOEBATCH_PHASE_CLOCKS=ON also prints, for each row that ran the bf16 wgmma
// expert GEMM or the prefill attention on wgmma, the cycles its warpgroups spent per tile in each
// phase (kernels/phase_clock.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/attention.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/phase_clock.cuh"
#include "kernels/random.cuh"
#include "tests/gpu/ops/op_case.h"
#include "tests/gpu/ops/op_util.h"

namespace {

using namespace moebatch;
using ops::DevBuf;

constexpr uint32_t kSeed = 1234;  // case i uses kSeed + i

struct Row {
  int batch;
  std::string kernel, note, check;
  double ms, bytes, flops;
  /// Diagnostic builds: the phase names and cycles per warpgroup tile of the wgmma kernel the row
  /// ran (kernels/phase_clock.cuh); else empty.
  std::vector<std::pair<std::string, double>> phases;
};

// The phase sums a take_phase_clocks call returned, per warpgroup tile, named; empty when the
// build has no phase clocks or no tile ran.
template <size_t N>
std::vector<std::pair<std::string, double>> per_tile(const std::vector<uint64_t>& totals,
                                                     const char* const (&names)[N]) {
  std::vector<std::pair<std::string, double>> out;
  if (totals.size() != N + 1 || totals.back() == 0) return out;
  for (size_t i = 0; i < N; ++i)
    out.emplace_back(names[i], static_cast<double>(totals[i]) / static_cast<double>(totals.back()));
  return out;
}

// The wgmma kernels' phase sums since the last call (a row runs one of them at most).
std::vector<std::pair<std::string, double>> take_phases() {
  auto phases = per_tile(moebatch::kernels::moe_wgmma_take_phase_clocks(), moebatch::kernels::kMoeWgmmaPhaseNames);
  auto fp8 = per_tile(moebatch::kernels::moe_wgmma_fp8_take_phase_clocks(), moebatch::kernels::kMoeWgmmaFp8PhaseNames);
  auto attention = per_tile(moebatch::kernels::attention_prefill_take_phase_clocks(),
                            moebatch::kernels::kAttentionPhaseNames);
  return !phases.empty() ? phases : !fp8.empty() ? fp8 : attention;
}

// Device-to-device copy of 2 GiB: bytes read + written per second, the bandwidth ceiling.
double copy_tbps(cudaStream_t s) {
  DevBuf<char> a(size_t{2} << 30), b(size_t{2} << 30);
  CUDA_CHECK(cudaMemset(a.get(), 1, a.size()));
  const double ms = ops::median_ms(
      s, [&](int) { CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), a.size(), cudaMemcpyDeviceToDevice, s)); }, 3, 10);
  return 2.0 * a.size() / (ms * 1e-3) / 1e12;
}

// Peer for the gate+up expert GEMM: the same weight bytes as equal-size groups through cuBLAS
// strided-batched GEMM over the experts a random routing hits (expected count), rows per expert
// = pairs / experts hit rounded up.
Row cublas_batched_gate_up(cublasHandle_t cublas, cudaStream_t s, int batch) {
  constexpr int kH = 2048, kE = 128, kK = 8, kI = 768;
  const int pairs = batch * kK;
  const int groups = static_cast<int>(std::lround(kE * (1.0 - std::pow(1.0 - double(kK) / kE, batch))));
  const int m = CEIL_DIV(pairs, groups);
  DevBuf<kernels::bf16> w(size_t(kE) * 2 * kI * kH), x(size_t(groups) * m * kH), out(size_t(groups) * m * 2 * kI);
  kernels::fill_uniform(w.get(), w.size(), 1, 0.02f, s);
  kernels::fill_uniform(x.get(), x.size(), 2, 1.f, s);
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_CHECK(cublasSetStream(cublas, s));
  const double ms = ops::median_ms(
      s,
      [&](int i) {
        // Rotate the expert window so the weights are not L2-resident between runs.
        const int first = (i * groups) % (kE - groups + 1);
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            cublas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * kI, m, kH, &alpha, w.get() + size_t(first) * 2 * kI * kH, CUDA_R_16BF,
            kH, int64_t{2} * kI * kH, x.get(), CUDA_R_16BF, kH, int64_t(m) * kH, &beta, out.get(), CUDA_R_16BF, 2 * kI,
            int64_t(m) * 2 * kI, groups, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      5, 40);
  const double bytes = groups * 2.0 * 2 * kI * kH;
  return {batch, "cublas batched gate_up (" + std::to_string(groups) + "x" + std::to_string(m) + ")", "peer", "",
          ms, bytes, 2.0 * groups * m * 2 * kI * kH, {}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "bench_kernels.json", filter;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") check = true;
    else if (a == "--filter" && i + 1 < argc) filter = argv[++i];
    else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: %s [out.json] [--check] [--filter TEXT]\n", argv[0]);
      return 2;
    } else json_path = a;
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  cublasHandle_t cublas;
  CUBLAS_CHECK(cublasCreate(&cublas));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const ops::OpEnv env{s, cublas, prop.multiProcessorCount};

  const double copy = copy_tbps(s);
  std::vector<Row> rows;
  int failures = 0;
  const auto table = ops::op_cases_bench();
  for (size_t i = 0; i < table.size(); ++i) {
    const ops::OpCaseDef& def = table[i];
    if (def.name.find(filter) == std::string::npos) continue;
    if (def.available && !def.available(0)) continue;
    const auto c = def.make();
    c->setup(env, kSeed + static_cast<uint32_t>(i));
    std::string verdict;
    if (check) {
      const ops::OpCheck r = ops::run_and_check(*c, env, def.tol);
      verdict = r.ok() ? "ok" : "FAIL";
      failures += !r.ok();
      std::printf("%-4s b%-5d %s [%s] %s\n", verdict.c_str(), def.batch, def.name.c_str(), def.shape.c_str(),
                  r.detail().c_str());
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    take_phases();  // the setup's and the check's launches are not timed
    const double ms = ops::op_case_median_ms(*c, env);
    CUDA_CHECK(cudaStreamSynchronize(s));
    rows.push_back({def.batch, def.name, c->note(), verdict, ms, c->bytes(), c->flops(), take_phases()});
  }
  for (int B : {1, 64, 256})
    if (std::string("cublas batched gate_up").find(filter) != std::string::npos)
      rows.push_back(cublas_batched_gate_up(cublas, s, B));
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.batch < b.batch; });

  nlohmann::json j;
  j["gpu"] = prop.name;
  j["sms"] = prop.multiProcessorCount;
  j["copy_TBps"] = copy;
  j["seed"] = kSeed;
  std::printf("\n%s, %d SMs, device copy %.2f TB/s (read + write), seed %u\n", prop.name, prop.multiProcessorCount,
              copy, kSeed);
  std::printf("%-6s %-44s %10s %9s %8s %9s  %s\n", "batch", "kernel", "us", "GB/s", "%copy", "TFLOP/s", "note");
  for (const auto& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9, tf = r.flops / (r.ms * 1e-3) / 1e12;
    std::printf("%-6d %-44s %10.1f %9.0f %7.0f%% %9.2f  %s%s\n", r.batch, r.kernel.c_str(), r.ms * 1e3, gbs,
                100.0 * gbs / (copy * 1e3), tf, r.note.c_str(), r.check == "FAIL" ? " CHECK FAILED" : "");
    nlohmann::json row = {{"batch", r.batch}, {"kernel", r.kernel}, {"us", r.ms * 1e3}, {"GBps", gbs},
                          {"TFLOPs", tf},     {"bytes", r.bytes},   {"note", r.note}};
    if (!r.check.empty()) row["check"] = r.check;
    if (!r.phases.empty()) {
      double total = 0;
      for (const auto& [name, cycles] : r.phases) total += cycles;
      std::printf("       phases per warpgroup tile (%.0f cycles):", total);
      for (const auto& [name, cycles] : r.phases) {
        std::printf(" %s %.0f (%.1f%%)", name.c_str(), cycles, 100.0 * cycles / total);
        row["phase_cycles_per_tile"][name] = cycles;
      }
      std::printf("\n");
    }
    j["rows"].push_back(row);
  }
  std::ofstream(json_path) << j.dump(2) << "\n";
  CUBLAS_CHECK(cublasDestroy(cublas));
  CUDA_CHECK(cudaStreamDestroy(s));
  return failures ? 1 : 0;
}
