// What a kernel boundary costs inside a decode step, against a grid-wide barrier inside one
// persistent kernel: the number that says how much a persistent per-layer ("megakernel") decode
// step could save at batch 1, where the step is ~8 launches per layer and even an L2-resident
// 20 MB GEMV costs ~7 µs (bench/RESULTS.md, 2026-12-02 session 9; docs/design.md).
//
// Every variant runs `phases` dependent phases over `blocks` CTAs of 128 threads. In phase p each
// CTA reads the value CTA (c + 1) % blocks wrote in phase p - 1 and writes it plus one, so a
// phase that started before the one before it had finished would leave a wrong count: the final
// values must all equal `phases` (checked, printed OK / FAIL).
//   launches      one plain launch per phase, captured into a CUDA graph
//   launches+pdl  the same launched dependent (kernels/launch.cuh: pdl_sync first), as the engine
//   barrier       one cooperative launch, the phases separated by a grid barrier (an arrival
//                 counter and a generation word in global memory, thread 0 of each CTA spinning)
// Time per phase: the median over 20 replays of (elapsed / phases), after 3 warm-ups.
// Usage: moebatch_lab_kernel_boundary [out.json] [--phases N] [--blocks N (0: one per SM)]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "bench/gpu/lab/lab_timing.cuh"

namespace {

using moebatch::kernels::launch_dependent;
using moebatch::kernels::pdl_sync;

constexpr int kThreads = 128;

// One phase: CTA c takes its neighbour's value from the buffer the phase before wrote.
__device__ __forceinline__ void phase_step(const int* in, int* out) {
  if (threadIdx.x == 0) {
    const int c = blockIdx.x, next = (c + 1) % gridDim.x;
    out[c] = __ldcg(in + next) + 1;
  }
}

__global__ void __launch_bounds__(kThreads) phase_kernel(const int* in, int* out) {
  phase_step(in, out);
}

__global__ void __launch_bounds__(kThreads) phase_kernel_pdl(const int* in, int* out) {
  pdl_sync();
  phase_step(in, out);
}

// Grid barrier: read the generation, arrive; the last arrival resets the count and bumps the
// generation, the others spin until it moves. Thread 0 of each CTA only; the CTA meets around it.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = atomicAdd(generation, 0);
    __threadfence();
    if (atomicAdd(count, 1) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(generation, 1);
    } else {
      while (atomicAdd(generation, 0) == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    barrier_kernel(int* a, int* b, int phases, unsigned* count, unsigned* generation) {
  for (int p = 0; p < phases; ++p) {
    phase_step(p % 2 == 0 ? a : b, p % 2 == 0 ? b : a);
    grid_barrier(count, generation);
  }
}

struct Variant {
  std::string name;
  double us_per_phase = 0;
  bool ok = false;
};

// Median µs per phase of `run` (which issues one whole pass of `phases` phases on `stream`).
template <typename Run>
double time_per_phase(cudaStream_t stream, int phases, Run run) {
  return 1e3 * moebatch::lab::median_ms(stream, run, 3, 20) / phases;
}

// Whether every CTA's final value is `phases` (the pass started from zeros).
bool counts_ok(const int* a, const int* b, int blocks, int phases) {
  std::vector<int> host(blocks);
  CUDA_CHECK(cudaMemcpy(host.data(), phases % 2 == 0 ? a : b, blocks * sizeof(int),
                        cudaMemcpyDeviceToHost));
  return std::all_of(host.begin(), host.end(), [&](int v) { return v == phases; });
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "lab_kernel_boundary.json";
  int phases = 432;  // 48 layers × 9 launches, the batch-1 step before session 9
  int blocks = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--phases" && i + 1 < argc) {
      phases = std::stoi(argv[++i]);
    } else if (arg == "--blocks" && i + 1 < argc) {
      blocks = std::stoi(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: %s [out.json] [--phases N] [--blocks N]\n", argv[0]);
      return 2;
    } else {
      json_path = arg;
    }
  }
  int device = 0, sms = 0, cooperative = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  if (blocks <= 0) blocks = sms;
  if (phases < 1 || blocks > sms) {
    std::fprintf(stderr, "--phases must be >= 1 and --blocks at most the %d SMs\n", sms);
    return 2;
  }

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int *a = nullptr, *b = nullptr;
  unsigned* sync = nullptr;  // [count, generation]
  CUDA_CHECK(cudaMalloc(&a, blocks * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&b, blocks * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
  const auto reset = [&] {
    CUDA_CHECK(cudaMemsetAsync(a, 0, blocks * sizeof(int), stream));
    CUDA_CHECK(cudaMemsetAsync(b, 0, blocks * sizeof(int), stream));
  };

  std::vector<Variant> rows;
  for (bool pdl : {false, true}) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int p = 0; p < phases; ++p) {
      const int* in = p % 2 == 0 ? a : b;
      int* out = p % 2 == 0 ? b : a;
      if (pdl) {
        launch_dependent(phase_kernel_pdl, blocks, kThreads, 0, stream, in, out);
      } else {
        phase_kernel<<<blocks, kThreads, 0, stream>>>(in, out);
      }
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    Variant v{pdl ? "launches+pdl" : "launches"};
    v.us_per_phase = time_per_phase(stream, phases, [&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
    reset();
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    v.ok = counts_ok(a, b, blocks, phases);
    rows.push_back(v);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
  if (cooperative) {
    unsigned* generation = sync + 1;
    void* args[] = {&a, &b, &phases, &sync, &generation};
    const auto launch = [&] {
      CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(barrier_kernel), blocks,
                                             kThreads, args, 0, stream));
    };
    Variant v{"barrier"};
    v.us_per_phase = time_per_phase(stream, phases, launch);
    reset();
    launch();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    v.ok = counts_ok(a, b, blocks, phases);
    rows.push_back(v);
  } else {
    std::fprintf(stderr, "this device has no cooperative launch: no barrier row\n");
  }

  std::printf("%d phases over %d CTAs of %d threads (%d SMs)\n", phases, blocks, kThreads, sms);
  std::printf("%-14s %12s %6s\n", "variant", "us/phase", "check");
  nlohmann::json out = nlohmann::json::array();
  bool all_ok = true;
  for (const Variant& v : rows) {
    std::printf("%-14s %12.3f %6s\n", v.name.c_str(), v.us_per_phase, v.ok ? "OK" : "FAIL");
    out.push_back({{"variant", v.name}, {"us_per_phase", v.us_per_phase}, {"ok", v.ok},
                   {"phases", phases}, {"blocks", blocks}});
    all_ok = all_ok && v.ok;
  }
  std::ofstream(json_path) << out.dump(2) << "\n";
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  CUDA_CHECK(cudaFree(sync));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return all_ok ? 0 : 1;
}
