// Kernel lab (in the manner of llm.c's dev/cuda): the split-K expert GEMM against the library's
// moe_gemm through the same op cases as the GPU tests and the kernel benchmark. First every
// variant is checked against the CPU reference on the shapes the split-K kernel was tested on in
// the library (an expert with two tiles, k = 19 steps over 4 warps, an idle last warp, a hot
// expert, a 50-row expert, the Qwen3 shape at 1 and 8 tokens); then both kernels are timed on
// Qwen3-30B-A3B shapes at the small batches split-K was meant for (median of 40 after warmup,
// rotating over 8 routings). Prints a table last, writes JSON, exits 1 when a check failed.
// Usage: moebatch_lab_moe_gemm_split_k [out.json]
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/gpu/lab/moe_gemm_split_k.cuh"
#include "kernels/cuda_check.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace {

using namespace moebatch::ops;

constexpr MoeGemmStage kStages[] = {MoeGemmStage::gate_up, MoeGemmStage::gate_up_silu, MoeGemmStage::down};

MoeGemmShape split_k(MoeGemmShape s) {
  s.kernel = &moebatch::lab::moe_gemm_split_k;
  s.kernel_name = "moe_gemm_split_k";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string json_path = argc > 1 ? argv[1] : "lab_moe_gemm_split_k.json";
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const OpEnv env{stream, nullptr, prop.multiProcessorCount};
  const uint32_t seed = std::random_device{}();
  std::printf("%s, seed %u\n", prop.name, seed);

  // Correctness: gate+up and down over all experts, gate+up+SiLU over the experts with pairs.
  const MoeGemmShape checks[] = {
      {.tokens = 9, .experts = 16, .top_k = 4, .hidden = 128, .inter = 64},              // 9 rows: two tiles
      {.tokens = 5, .experts = 8, .top_k = 2, .hidden = 608, .inter = 96, .hot = 1},     // k = 19 steps: 5, 5, 5, 4
      {.tokens = 8, .experts = 16, .top_k = 8, .hidden = 256, .inter = 128, .hot = 3},   // expert 3 has a full tile
      {.tokens = 3, .experts = 8, .top_k = 2, .hidden = 96, .inter = 64},                // 3 steps: the last warp idle
      {.tokens = 50, .experts = 16, .top_k = 4, .hidden = 128, .inter = 128, .hot = 2},  // a 50-row expert (7 tiles)
      {.tokens = 1, .experts = 128, .top_k = 8, .hidden = 2048, .inter = 768},
      {.tokens = 8, .experts = 128, .top_k = 8, .hidden = 2048, .inter = 768},
  };
  int failures = 0, index = 0;
  for (MoeGemmShape s : checks)
    for (MoeGemmStage stage : kStages) {
      s.stage = stage;
      s.active_experts = stage == MoeGemmStage::gate_up_silu;
      const OpCaseDef def = moe_gemm_case(split_k(s));
      const auto c = def.make();
      c->setup(env, seed + index++);
      const OpCheck r = run_and_check(*c, env, def.tol);
      failures += !r.ok();
      std::printf("%s %s [%s] %s\n", r.ok() ? "ok  " : "FAIL", def.name.c_str(), def.shape.c_str(), r.detail().c_str());
    }

  // Timing on the engine's launches (grid over the experts with pairs), same inputs for both.
  struct Row {
    int batch;
    std::string stage;
    double us[2], gbs[2];
  };
  std::vector<Row> rows;
  for (int B : {1, 8, 64})
    for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down}) {
      const MoeGemmShape base{.tokens = B, .experts = 128, .top_k = 8, .hidden = 2048, .inter = 768, .stage = stage,
                              .active_experts = true, .routings = 8};
      Row row{B, stage == MoeGemmStage::down ? "down" : "gate_up+silu", {}, {}};
      for (int v = 0; v < 2; ++v) {
        const auto c = moe_gemm_case(v == 0 ? base : split_k(base)).make();
        c->setup(env, seed);
        const double ms = op_case_median_ms(*c, env);
        row.us[v] = ms * 1e3;
        row.gbs[v] = c->bytes() / (ms * 1e-3) / 1e9;
      }
      rows.push_back(row);
    }

  nlohmann::json j;
  j["gpu"] = prop.name;
  j["seed"] = seed;
  j["check_failures"] = failures;
  std::printf("\n%-6s %-14s %14s %14s %9s %9s %8s\n", "batch", "stage", "moe_gemm us", "split_k us", "GB/s", "GB/s", "ratio");
  for (const Row& r : rows) {
    std::printf("%-6d %-14s %14.1f %14.1f %9.0f %9.0f %7.2fx\n", r.batch, r.stage.c_str(), r.us[0], r.us[1], r.gbs[0],
                r.gbs[1], r.us[1] / r.us[0]);
    for (int v = 0; v < 2; ++v)
      j["rows"].push_back({{"batch", r.batch},
                           {"kernel", std::string(v == 0 ? "moe_gemm " : "moe_gemm_split_k ") + r.stage},
                           {"us", r.us[v]},
                           {"GBps", r.gbs[v]}});
  }
  std::ofstream(json_path) << j.dump(2) << "\n";
  std::printf("%d check failure(s)\n", failures);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return failures ? 1 : 0;
}
