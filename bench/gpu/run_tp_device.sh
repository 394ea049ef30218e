#!/usr/bin/env bash
# Device calls for tensor parallelism on 2 GPUs (device kind nvidia-h200-x2). Builds the
# engine-only tree (tests + benchmarks), then by step:
#   tests  the all-reduce kernel tests and the tensor-parallel engine tests (TP=2 / EP=2 against
#          TP=1 and the oracles, custom all-reduce vs NCCL, graph replay, stuck-rank watchdog),
#          then the all-reduce benchmark (NCCL vs ours by message size)
#   bench  the engine benchmark on SHAPE (default qwen3-30b-a3b): TP=1, TP=2 (peer-to-peer
#          all-reduce fused with add + RMSNorm), TP=2 with NCCL only, EP=2; extra flags in
#          BENCH_FLAGS (e.g. "--quantization fp8")
#   shapes TP=2 on the seed-class shape (bf16) and on Qwen3-Next-80B-A3B (bf16)
# Logs and JSON go to $OUT; summaries print last.
# Usage: bench/gpu/run_tp_device.sh tests|bench|shapes
set -uo pipefail
OUT=${OUT:-/tmp/moebatch-out}
WHAT=${1:-tests}
SHAPE=${SHAPE:-qwen3-30b-a3b}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
if ! cmake -S . -B build-dev -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON > "$OUT/configure.log" 2>&1; then
  tail -40 "$OUT/configure.log"; exit 1
fi
targets="moebatch_bench_engine_cuda"
[ "$WHAT" = tests ] && targets="moebatch_gpu_engine_tests moebatch_gpu_allreduce_tests moebatch_bench_allreduce"
if ! cmake --build build-dev -j"$(nproc)" --target $targets > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1
fi
echo "built at $(date +%T)"
bench() {  # bench <name> <flags...>
  local name=$1; shift
  timeout 240 ./build-dev/moebatch_bench_engine_cuda "$@" $BENCH_FLAGS "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "== $name ($*) rc=$?"; grep -B2 -A5 "^ *batch |" "$OUT/$name.log" | tail -6
}
BENCH_FLAGS=${BENCH_FLAGS:-}
case "$WHAT" in
  tests)
    timeout 120 ./build-dev/moebatch_gpu_allreduce_tests > "$OUT/allreduce_tests.log" 2>&1
    echo "allreduce tests rc=$?"; grep -E "FAIL|^\[  PASSED|^\[==" "$OUT/allreduce_tests.log" | head -20
    timeout 300 ./build-dev/moebatch_gpu_engine_tests \
      --gtest_filter="${ENGINE_FILTER:-*TensorParallel*:*Watchdog*}" > "$OUT/engine_tests.log" 2>&1
    echo "engine tests rc=$?"
    grep -E "Failure|Expected|Which is|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -40
    timeout 150 ./build-dev/moebatch_bench_allreduce "$OUT/bench_allreduce.json" > "$OUT/bench_allreduce.log" 2>&1
    echo "allreduce bench rc=$?"; tail -22 "$OUT/bench_allreduce.log"
    ;;
  bench)
    bench tp1 --shape "$SHAPE" --tp 1
    bench tp2 --shape "$SHAPE" --tp 2
    bench tp2_nccl --shape "$SHAPE" --tp 2 --disable-custom-all-reduce
    bench ep2 --shape "$SHAPE" --tp 2 --ep
    ;;
  shapes)
    bench seed_tp2 --shape flash-next-125b-a6b --tp 2
    bench next_tp2 --shape qwen3-next-80b-a3b --tp 2
    ;;
esac
