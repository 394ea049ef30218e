#!/usr/bin/env bash
# One device call: configure (engine-only), build the kernel tests and the microbenchmark, run
# both. Logs and JSON go to $OUT; the test summary and the benchmark table print last.
set -uo pipefail
OUT=${OUT:-/tmp/moebatch-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
if ! cmake -S . -B build-dev -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON > "$OUT/configure.log" 2>&1; then
  tail -40 "$OUT/configure.log"; exit 1
fi
if ! cmake --build build-dev -j16 --target moebatch_gpu_tests moebatch_bench_kernels > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1
fi
./build-dev/moebatch_gpu_tests --gtest_output="json:$OUT/gtest.json" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
grep -E "Failure|Expected|Which is|relative L2|error|FAILED|^\[  PASSED|^\[==" "$OUT/tests.log" | head -80
./build-dev/moebatch_bench_kernels "$OUT/bench_kernels.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
cat "$OUT/gpu.txt"
tail -60 "$OUT/bench.log"
