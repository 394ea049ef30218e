#!/usr/bin/env bash
# One device call for the CUDA engine: configure (engine-only), build the engine GPU tests, the
# kernel tests and the engine benchmark; run the tests, then the HF peer (its own 61 GB, freed
# when it exits), then the benchmark. Logs and JSON go to $OUT; summaries print last.
# Usage: bench/gpu/run_engine_device.sh [tests|bench|all|base|ab|variants|quant|prefill|w8a8|linear|experts|phases|decode|gemv4|ncu] [peer batches, e.g. 1,64, or none]
# `quant`: the compressed-weight run: kernel and engine tests, the quant kernel rows, the engine
# benchmark on the 30B shape with bf16 / fp8 / nvfp4 linear weights, and the seed-class shape in
# NVFP4 on one GPU.
# `base`: build and run only the engine benchmark of an earlier tree, BASE_SRC (a tarball of it
# with a top-level src/: `git archive <commit> --prefix=src/ CMakeLists.txt cmake common engine
# kernels bench tests/gpu/ops | gzip`, as an untracked file of the tree), for a before/after
# comparison on the same machine; its JSON is bench_engine_cuda_base.json.
# `w8a8`: the W8A8 expert GEMM: its kernel cases, engine tests (ENGINE_FILTER), the wgmma
# kernel rows, the engine benchmark on the 30B shape in bf16, fp8 W8A8 and fp8 decoded to bf16,
# and Qwen3-Next-80B in fp8.
# `linear`: the W8A8 projections on cuBLASLt: their kernel cases, the FP8 engine tests, the
# projection rows, the engine benchmark in bf16, fp8 and fp8 with the projections decoded.
# `prefill`: kernel and engine tests, the prefill expert GEMM rows (wgmma and its cuBLAS peer),
# the engine benchmark on the 30B shape with the wgmma experts and without them.
# `experts`: the wgmma expert GEMMs in one call: their op cases (and the other MoE kernels'),
#   the engine tests, the kernel rows matching EXPERT_ROWS (default moe_wgmma: bf16 and W8A8) and
#   the 30B engine benchmark (decode batches EXPERT_BATCHES, default 1,64,256) with each weight
#   format of EXPERT_QUANT (default none, e.g. "none fp8"); EXPERT_TESTS=0 skips the tests;
#   EXPERT_SMOKE: a gtest filter of op cases run first under a limit (SMOKE_TIMEOUT s, default 60),
#   stopping on failure.
# `decode`: the decode step's op cases (moe_gemv, decode attention, router, rope, combine), the
#   engine tests, batch 1 / 256 for each of DECODE_VARIANTS (default: default combine default
#   combine; also unfused = --disable-fused-rope, combine = --combine-norm-in-qkv,
#   sep = --disable-combine-in-down, noclu = --disable-cluster-attention-merge,
#   noclr = --disable-cluster-router, late = --disable-pdl-trigger-early), and the step
#   trace at batch 1 (with TRACE_FLAGS; DECODE_TRACE=0: none). DECODE_TESTS: the op cases' gtest filter.
# `gemv4`: the 4-bit expert GEMVs on tensor cores against their CUDA-core walk: op cases, engine
#   tests, the moe_gemv kernel rows (batch 1), the 30B step at batches 1 and 8 (GEMV4_BATCHES) for each of
#   GEMV4_VARIANTS (default: none nvfp4 nvfp4:cc int4 int4:cc; modifiers, any number, each after
#   a colon: "cc" = --disable-mma-gemv, "regs" = --disable-stream-gemv, "sep" = --disable-combine-in-down).
# `ncu`: ncu's per-instruction warp-stall samples of one decode kernel each (NCU_KERNELS, default
#   the router and the split attention kernel) from the batch-1 engine benchmark, with its
#   duration and SM frequency, and nvidia-smi's clocks while it ran. NCU_SKIP: launches of the
#   kernel skipped first (default 100); NCU_ARGS: the benchmark's flags; NCU_ROWS_FILTER: profile
#   moebatch_bench_kernels' rows matching it instead (the prefill kernels: under ncu the engine
#   benchmark's 8 × 1024 prefill launched no kernel ncu could match, 2026-12-06).
# `ab`: compile-time variants on one machine: the engine benchmark (AB_BATCHES, default 1) of
#   the tree, then of the tree with each patch of AB_PATCHES applied (`git diff` output saved as
#   untracked files of the tree; applied with `patch -p1`, rebuilt, reverted), AB_ROUNDS times
#   (default 2) in turn; each with the weights of every AB_QUANT (default none; e.g. "none nvfp4
#   fp8 int4").
# `variants`: run-time variants on one build: the op cases matching VARIANT_TESTS (a gtest
#   filter; none when empty) and the engine tests, the kernel rows matching each word of
#   VARIANT_ROWS, then the engine benchmark (VARIANT_BATCHES, default 1) of every entry of
#   VARIANTS, VARIANT_ROUNDS times (default 2) in turn. An entry is a quantization and the
#   benchmark's flags after colons, e.g. "none none:--disable-prefill-rope-q fp8".
# `phases`: a diagnostic build (build-pc, -DMOEBATCH_PHASE_CLOCKS=ON -DMOEBATCH_STEP_TRACE=ON): the
#   moe_wgmma, moe_wgmma_fp8 and prefill attention rows (PHASE_ROWS: the kernel-row filters, one
#   word each) with the cycles per tile in each phase, then the engine
#   benchmark (TRACE_BATCHES, default 1,256; TRACE_QUANT, default none, e.g. "none fp8") with
#   each decode step's critical path kernel by kernel (kernels/step_trace.cuh; TRACE_ONLY=1 for
#   that alone).
set -uo pipefail
OUT=${OUT:-/tmp/moebatch-out}
WHAT=${1:-all}
PEER_BATCHES=${2:-1,64}
mkdir -p "$OUT"
# A warm machine keeps its build directories from the last call, and this call's copied sources
# can be older than objects built there from other contents (an `ab` variant, a reverted
# experiment): ninja would then run stale code (session 30, twice). Sources whose contents
# changed since the last call are touched, so they rebuild.
sums=/tmp/moebatch-sources.md5
[ -f "$sums" ] && md5sum --quiet -c "$sums" 2>/dev/null | sed -n 's/: FAILED.*//p' | xargs -r touch
find kernels engine common tests/gpu bench/gpu -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \
  -o -name '*.h' -o -name CMakeLists.txt \) -print0 | xargs -0 md5sum > "$sums"
if [ "$WHAT" = base ]; then
  rm -rf /tmp/base && mkdir -p /tmp/base && tar xzf "${BASE_SRC:?}" -C /tmp/base
  cmake -S /tmp/base/src -B /tmp/base/build -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON \
    -DMOEBATCH_BUILD_TESTS=OFF > "$OUT/base_configure.log" 2>&1 || { tail -20 "$OUT/base_configure.log"; exit 1; }
  cmake --build /tmp/base/build -j16 --target moebatch_bench_engine_cuda > "$OUT/base_build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/base_build.log" | head -40; exit 1; }
  /tmp/base/build/moebatch_bench_engine_cuda "$OUT/bench_engine_cuda_base.json" > "$OUT/bench_base.log" 2>&1
  echo "base bench rc=$?"; tail -40 "$OUT/bench_base.log"
  exit 0
fi
if [ "$WHAT" = ab ]; then
  cmake -S . -B build-dev -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON -DMOEBATCH_BUILD_TESTS=OFF \
    > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
  ab_bench() {  # $1: the variant's name
    cmake --build build-dev -j16 --target moebatch_bench_engine_cuda > "$OUT/build_$1.log" 2>&1 ||
      { grep -E "error" -A3 "$OUT/build_$1.log" | head -30; return 1; }
    for q in ${AB_QUANT:-none}; do
      MOEBATCH_BENCH_BATCHES=${AB_BATCHES:-1} timeout 120 ./build-dev/moebatch_bench_engine_cuda --quantization $q \
        "/tmp/ab_$1_$q.json" > /tmp/ab.log 2>&1
      echo "ab $1 $q rc=$?"; cat /tmp/ab.log >> "$OUT/bench_ab_$1_$q.log"
      grep -E "^ *[0-9]+ \|" /tmp/ab.log | head -4
    done
  }
  for round in $(seq ${AB_ROUNDS:-2}); do
    ab_bench tree
    for patch in ${AB_PATCHES:-}; do
      patch -p1 --quiet < "$patch" || { echo "$patch does not apply"; exit 1; }
      ab_bench "$(basename "$patch" .patch)"
      patch -p1 -R --quiet < "$patch"
    done
  done
  exit 0
fi
# The diagnostic build (build-pc: -DMOEBATCH_PHASE_CLOCKS=ON -DMOEBATCH_STEP_TRACE=ON) that
# `phases` runs; DIAG_BUILD_TOO=1 makes another mode start it in the background once its own
# build is done, so that a `phases` call right after (the machine still warm) finds it built.
build_diag() {
  cmake -S . -B build-pc -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON -DMOEBATCH_BUILD_TESTS=OFF \
    -DMOEBATCH_PHASE_CLOCKS=ON -DMOEBATCH_STEP_TRACE=ON > "$OUT/pc_configure.log" 2>&1 || return 1
  cmake --build build-pc -j${1:-16} --target moebatch_bench_kernels moebatch_bench_engine_cuda > "$OUT/pc_build.log" 2>&1
}
if [ "$WHAT" = phases ]; then
  # cycles per tile in each phase of the wgmma kernels, and the decode steps' kernel-by-kernel
  # critical path at batches 1 and 256
  build_diag || { tail -20 "$OUT/pc_configure.log"; grep -E "error" -A3 "$OUT/pc_build.log" | head -40; exit 1; }
  echo "built at $(date +%T)"
  if [ -z "${TRACE_ONLY:-}" ]; then  # TRACE_ONLY=1: the engine's step trace alone
    for f in ${PHASE_ROWS:-"moe_wgmma " moe_wgmma_fp8 attn_prefill}; do
      timeout 150 ./build-pc/moebatch_bench_kernels "/tmp/bench_kernels_pc.json" --filter "$f" >> "$OUT/bench_kernels_phases.log" 2>&1
      echo "phase clocks $f rc=$?"
    done
    grep -E "moe_|attn_|phases" "$OUT/bench_kernels_phases.log"
  fi
  for q in ${TRACE_QUANT:-none}; do
    MOEBATCH_BENCH_BATCHES=${TRACE_BATCHES:-1,256} timeout 150 ./build-pc/moebatch_bench_engine_cuda --quantization $q \
      "/tmp/bench_engine_trace_$q.json" > /tmp/trace_$q.log 2>&1
    echo "traced engine ($q) rc=$?"; cat /tmp/trace_$q.log >> "$OUT/bench_engine_trace.log"
    grep -E "step trace|SM clock|call site|^  [a-z_]+\.cu|one layer|^    " /tmp/trace_$q.log | head -${TRACE_LINES:-70}
  done
  exit 0
fi
if [ "$WHAT" = ncu ]; then
  # one decode kernel of the batch-1 step in isolation (ncu serializes): its warp-stall samples
  # per SASS instruction (bench/gpu/ncu_stalls.py), first NCU_KERNEL (default the router), a few
  # layers into the second timed step; the SM clock while it ran (nvidia-smi, sampled)
  cmake -S . -B build-dev -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON -DMOEBATCH_BUILD_TESTS=OFF \
    > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
  cmake --build build-dev -j16 --target moebatch_bench_engine_cuda moebatch_bench_kernels > "$OUT/build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
  echo "built at $(date +%T)"
  # NCU_ROWS_FILTER: profile the kernel rows matching it (moebatch_bench_kernels --filter) instead
  # of the engine benchmark, e.g. a prefill kernel on its own
  target=(./build-dev/moebatch_bench_engine_cuda ${NCU_ARGS:-} /tmp/ncu_bench.json)
  [ -n "${NCU_ROWS_FILTER:-}" ] && target=(./build-dev/moebatch_bench_kernels /tmp/ncu_rows.json --filter "$NCU_ROWS_FILTER")
  for k in ${NCU_KERNELS:-route_small_kernel attention_decode_split_kernel}; do
    (nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 100 > "/tmp/clocks_$k.txt" 2>&1 &
     echo $! > /tmp/smi.pid)
    MOEBATCH_BENCH_BATCHES=1 timeout 240 ncu --section SourceCounters --section SpeedOfLight --import-source yes \
      -k regex:$k --launch-skip ${NCU_SKIP:-100} --launch-count 1 --clock-control none -o "/tmp/ncu_$k" -f \
      "${target[@]}" > "$OUT/ncu_$k.log" 2>&1
    echo "ncu $k rc=$?"; kill "$(cat /tmp/smi.pid)" 2>/dev/null
    sort "/tmp/clocks_$k.txt" | uniq -c | sort -rn | head -3
    ncu -i "/tmp/ncu_$k.ncu-rep" --page details > "$OUT/ncu_${k}_details.txt" 2>&1
    grep -E "Duration|SM Frequency|Elapsed Cycles" "$OUT/ncu_${k}_details.txt" | head -4
    ncu -i "/tmp/ncu_$k.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_${k}_source.csv" 2>&1
    python3 bench/gpu/ncu_stalls.py "$OUT/ncu_${k}_source.csv" --rows ${NCU_ROWS:-25} | tee "$OUT/stalls_$k.txt"
  done
  exit 0
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
if ! cmake -S . -B build-dev -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON > "$OUT/configure.log" 2>&1; then
  tail -40 "$OUT/configure.log"; exit 1
fi
if ! cmake --build build-dev -j16 --target moebatch_gpu_engine_tests moebatch_gpu_tests moebatch_bench_engine_cuda moebatch_bench_kernels > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1
fi
if [ "${DIAG_BUILD_TOO:-0}" = 1 ]; then
  build_diag 8 &
  trap 'wait' EXIT  # the diagnostic build finishes before the call returns
fi
# The kernel op cases matching gtest filter $1 and every engine test, with their summaries.
run_gpu_tests() {
  timeout 200 ./build-dev/moebatch_gpu_tests --gtest_filter="$1" > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"; grep -E "FAIL|^\[  PASSED|^\[==|SKIPPED" "$OUT/kernel_tests.log" | head -30
  timeout 180 ./build-dev/moebatch_gpu_engine_tests > "$OUT/engine_tests.log" 2>&1
  echo "engine tests rc=$?"
  grep -E "Failure|Expected|Which is|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -30
}
if [ "$WHAT" = quant ]; then
  echo "built at $(date +%T)"
  timeout 150 ./build-dev/moebatch_gpu_tests > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"; grep -E "FAIL|^\[  PASSED|^\[==" "$OUT/kernel_tests.log" | head -40
  timeout 200 ./build-dev/moebatch_gpu_engine_tests --gtest_filter="${ENGINE_FILTER:-*}" > "$OUT/engine_tests.log" 2>&1
  echo "engine tests rc=$?"
  grep -E "Failure|Expected|Which is|quantized to|positions compared|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -60
  for q in none fp8 nvfp4; do
    timeout 100 ./build-dev/moebatch_bench_engine_cuda --quantization $q "$OUT/bench_engine_$q.json" > "$OUT/bench_engine_$q.log" 2>&1
    echo "bench $q rc=$?"; tail -6 "$OUT/bench_engine_$q.log"
  done
  timeout 150 ./build-dev/moebatch_bench_engine_cuda --shape flash-next-125b-a6b --quantization nvfp4 "$OUT/bench_seed_nvfp4.json" > "$OUT/bench_seed_nvfp4.log" 2>&1
  echo "seed nvfp4 rc=$?"; head -4 "$OUT/bench_seed_nvfp4.log"; tail -6 "$OUT/bench_seed_nvfp4.log"
  for f in qkv o_proj "moe_gemm gate_up_silu"; do
    timeout 100 ./build-dev/moebatch_bench_kernels "$OUT/bench_kernels_${f// /_}.json" --filter "$f" > "$OUT/bench_kernels_${f// /_}.log" 2>&1
  done
  cat "$OUT"/bench_kernels_*.log | grep -vE "^\s*$" | head -80
  exit 0
fi
if [ "$WHAT" = w8a8 ]; then
  timeout 200 ./build-dev/moebatch_gpu_tests --gtest_filter='*moe_wgmma*:*quantize*:*moe_sorted*' > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"; grep -E "FAIL|^\[  PASSED|^\[==|SKIPPED" "$OUT/kernel_tests.log" | head -30
  timeout 200 ./build-dev/moebatch_gpu_engine_tests --gtest_filter="${ENGINE_FILTER:-*}" > "$OUT/engine_tests.log" 2>&1
  echo "engine tests rc=$?"
  grep -E "Failure|Expected|Which is|W8A8|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -40
  timeout 100 ./build-dev/moebatch_bench_kernels "$OUT/bench_kernels_wgmma.json" --filter moe_wgmma > "$OUT/bench_kernels_wgmma.log" 2>&1
  echo "kernels rc=$?"; grep -E "moe_" "$OUT/bench_kernels_wgmma.log"
  for v in "none" "fp8" "fp8 --disable-w8a8-experts"; do
    tag=${v// /_}
    timeout 120 ./build-dev/moebatch_bench_engine_cuda --quantization $v "$OUT/bench_engine_$tag.json" > "$OUT/bench_engine_$tag.log" 2>&1
    echo "bench $v rc=$?"; tail -8 "$OUT/bench_engine_$tag.log"
  done
  timeout 150 ./build-dev/moebatch_bench_engine_cuda --shape qwen3-next-80b-a3b --quantization fp8 "$OUT/bench_next_fp8.json" > "$OUT/bench_next_fp8.log" 2>&1
  echo "next fp8 rc=$?"; tail -8 "$OUT/bench_next_fp8.log"
  exit 0
fi
if [ "$WHAT" = linear ]; then
  # FP8-block projections as W8A8 on cuBLASLt (kernels/gemm_fp8.cuh): their op cases and the
  # quantizer's, the engine tests of the FP8 fixture (ENGINE_FILTER), the projection rows, and
  # the 30B engine benchmark in bf16, fp8 and fp8 with the projections decoded to bf16.
  timeout 120 ./build-dev/moebatch_gpu_tests --gtest_filter='*cuBLASLt*:*quantize*:*quant_linear*' > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"; grep -E "FAIL|^\[  PASSED|^\[==|SKIPPED|Failure|rel" "$OUT/kernel_tests.log" | head -30
  timeout 200 ./build-dev/moebatch_gpu_engine_tests --gtest_filter="${ENGINE_FILTER:-*fp8*}" > "$OUT/engine_tests.log" 2>&1
  echo "engine tests rc=$?"
  grep -E "Failure|Expected|Which is|rows within|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -40
  # (JSON to /tmp and one log per tool: the device call returns a few files only)
  for f in qkv o_proj; do
    timeout 100 ./build-dev/moebatch_bench_kernels "/tmp/bench_kernels_$f.json" --filter "$f" >> "$OUT/bench_kernels_linear.log" 2>&1
  done
  echo "kernels rc=$?"; grep -E "qkv|o_proj" "$OUT/bench_kernels_linear.log" | grep -vE "gemv|L2-res"
  for v in "none" "fp8" "fp8 --disable-w8a8-linear"; do
    tag=${v// /_}
    echo "=== $v" >> "$OUT/bench_engine_linear.log"
    timeout 120 ./build-dev/moebatch_bench_engine_cuda --quantization $v "/tmp/bench_engine_$tag.json" > /tmp/bench_engine_$tag.log 2>&1
    echo "bench $v rc=$?"; cat /tmp/bench_engine_$tag.log >> "$OUT/bench_engine_linear.log"; tail -8 /tmp/bench_engine_$tag.log
  done
  exit 0
fi
if [ "$WHAT" = prefill ]; then
  timeout 150 ./build-dev/moebatch_gpu_tests > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"; grep -E "FAIL|^\[  PASSED|^\[==|SKIPPED" "$OUT/kernel_tests.log" | head -30
  timeout 200 ./build-dev/moebatch_gpu_engine_tests > "$OUT/engine_tests.log" 2>&1
  echo "engine tests rc=$?"
  grep -E "Failure|Expected|Which is|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -40
  for f in moe_wgmma moe_sorted; do
    timeout 100 ./build-dev/moebatch_bench_kernels "$OUT/bench_kernels_$f.json" --filter "$f" > "$OUT/bench_kernels_$f.log" 2>&1
    echo "kernels $f rc=$?"; grep -E "moe_" "$OUT/bench_kernels_$f.log"
  done
  for v in wgmma cublas; do
    flag=""; [ $v = cublas ] && flag=--disable-wgmma-experts
    timeout 120 ./build-dev/moebatch_bench_engine_cuda $flag "$OUT/bench_engine_$v.json" > "$OUT/bench_engine_$v.log" 2>&1
    echo "bench $v rc=$?"; tail -8 "$OUT/bench_engine_$v.log"
  done
  exit 0
fi
if [ "$WHAT" = experts ]; then
  echo "built at $(date +%T)"
  if [ -n "${EXPERT_SMOKE:-}" ]; then  # a new kernel's own op cases first, a hang cut short
    timeout "${SMOKE_TIMEOUT:-60}" ./build-dev/moebatch_gpu_tests --gtest_filter="$EXPERT_SMOKE" > "$OUT/smoke_tests.log" 2>&1
    rc=$?; echo "smoke tests rc=$rc"; grep -E "FAIL|^\[  PASSED|^\[==" "$OUT/smoke_tests.log" | head -20
    [ $rc = 0 ] || exit 1
  fi
  [ "${EXPERT_TESTS:-1}" = 1 ] && run_gpu_tests '*moe*:*Moe*:*expert*'
  timeout 120 ./build-dev/moebatch_bench_kernels "/tmp/bench_kernels_wgmma.json" --filter "${EXPERT_ROWS:-moe_wgmma}" \
    > "$OUT/bench_kernels_wgmma.log" 2>&1
  echo "kernels rc=$?"; grep -E "moe_" "$OUT/bench_kernels_wgmma.log"
  for q in ${EXPERT_QUANT:-none}; do
    MOEBATCH_BENCH_BATCHES=${EXPERT_BATCHES:-1,64,256} timeout 120 ./build-dev/moebatch_bench_engine_cuda \
      --quantization $q "$OUT/bench_engine_$q.json" > "$OUT/bench_engine_$q.log" 2>&1
    echo "bench $q rc=$?"; grep -E "moe_gemm|prefill of|^ *[0-9]+ \|" "$OUT/bench_engine_$q.log" | head -30
  done
  exit 0
fi
if [ "$WHAT" = variants ]; then
  echo "built at $(date +%T)"
  [ -n "${VARIANT_TESTS:-}" ] && run_gpu_tests "$VARIANT_TESTS"
  for f in ${VARIANT_ROWS:-}; do
    timeout 120 ./build-dev/moebatch_bench_kernels "/tmp/bench_kernels_rows.json" --filter "$f" >> "$OUT/bench_kernels_variants.log" 2>&1
    echo "kernels $f rc=$?"
  done
  [ -n "${VARIANT_ROWS:-}" ] && grep -E "^ *[0-9]+ +\|" "$OUT/bench_kernels_variants.log" | head -40
  for round in $(seq ${VARIANT_ROUNDS:-2}); do
    for v in ${VARIANTS:-none}; do
      q=${v%%:*}; flags=$(echo "$v" | tr ':' ' ' | cut -s -d' ' -f2-)
      MOEBATCH_BENCH_BATCHES=${VARIANT_BATCHES:-1} timeout 120 ./build-dev/moebatch_bench_engine_cuda --quantization $q $flags \
        "/tmp/bench_engine_variant.json" > /tmp/bench_engine.log 2>&1
      echo "bench $v (round $round) rc=$?"; { echo "=== $v round $round"; cat /tmp/bench_engine.log; } >> "$OUT/bench_engine_variants.log"
      grep -E "prefill of|attention|qk_norm_rope|^ *[0-9]+ \|" /tmp/bench_engine.log | head -12
    done
  done
  exit 0
fi
if [ "$WHAT" = gemv4 ]; then
  # the 4-bit expert GEMVs on tensor cores: the moe_gemv op cases (both walks), the engine tests,
  # the kernel rows, and the 30B step in bf16 / nvfp4 / int4 with each walk
  echo "built at $(date +%T)"
  run_gpu_tests '*moe_gemv*:*moe_gemm*:*dequant*:*nvfp4*:*int4*'
  timeout 100 ./build-dev/moebatch_bench_kernels "/tmp/bench_kernels_gemv.json" --filter "moe_gemv" > "$OUT/bench_kernels_gemv.log" 2>&1
  echo "kernels rc=$?"; grep -E "moe_gemv" "$OUT/bench_kernels_gemv.log" | head -60
  for v in ${GEMV4_VARIANTS:-none nvfp4 nvfp4:cc int4 int4:cc}; do
    q=${v%%:*}; flag=""
    for m in $(echo "$v" | tr ':' ' ' | cut -s -d' ' -f2-); do
      case $m in cc) flag="$flag --disable-mma-gemv" ;; regs) flag="$flag --disable-stream-gemv" ;;
        sep) flag="$flag --disable-combine-in-down" ;; *) echo "unknown variant modifier $m"; exit 1 ;; esac
    done
    MOEBATCH_BENCH_BATCHES=${GEMV4_BATCHES:-1,8} timeout 100 ./build-dev/moebatch_bench_engine_cuda --quantization $q $flag \
      "/tmp/bench_engine_$v.json" > /tmp/bench_engine.log 2>&1
    echo "bench $v rc=$?"; cat /tmp/bench_engine.log >> "$OUT/bench_engine_gemv4.log"
    grep -E "^ *[0-9]+ \|" /tmp/bench_engine.log | head -4
  done
  exit 0
fi
if [ "$WHAT" = decode ]; then
  # the decode step's kernels: the moe_gemv / decode attention / router op cases, the engine
  # tests, the 30B benchmark at batches 1 and 256 with and without the fused rope, then the
  # diagnostic build's step trace at batch 1
  echo "built at $(date +%T)"
  run_gpu_tests "${DECODE_TESTS:-*moe_gemv*:*attn_decode*:*route*:*rope*:*combine*}"
  for v in ${DECODE_VARIANTS:-default combine default combine}; do
    flag=""; [ $v = unfused ] && flag=--disable-fused-rope; [ $v = combine ] && flag=--combine-norm-in-qkv
    [ $v = sep ] && flag=--disable-combine-in-down; [ $v = noclu ] && flag=--disable-cluster-attention-merge
    [ $v = noclr ] && flag=--disable-cluster-router; [ $v = late ] && flag=--disable-pdl-trigger-early
    MOEBATCH_BENCH_BATCHES=1,256 timeout 130 ./build-dev/moebatch_bench_engine_cuda $flag "/tmp/bench_engine_$v.json" \
      > /tmp/bench_engine_$v.log 2>&1
    echo "bench $v rc=$?"; cat /tmp/bench_engine_$v.log >> "$OUT/bench_engine_decode.log"
    grep -E "^ *[0-9]+ \||^prefill of" /tmp/bench_engine_$v.log | head -4
  done
  [ "${DECODE_TRACE:-1}" = 0 ] && exit 0
  build_diag || { grep -E "error" -A3 "$OUT/pc_build.log" | head -20; exit 1; }
  MOEBATCH_BENCH_BATCHES=1 timeout 100 ./build-pc/moebatch_bench_engine_cuda ${TRACE_FLAGS:-} /tmp/trace.json > /tmp/trace.log 2>&1
  echo "traced rc=$?"; cat /tmp/trace.log >> "$OUT/bench_engine_decode.log"
  grep -E "step trace|SM clock|call site|^  [a-z_]+\.cu|one layer|^    " /tmp/trace.log | head -40
  exit 0
fi
if [ "$WHAT" != bench ]; then
  ./build-dev/moebatch_gpu_engine_tests --gtest_output="json:$OUT/engine_tests.json" > "$OUT/engine_tests.log" 2>&1
  echo "engine tests rc=$?"
  ./build-dev/moebatch_gpu_tests > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$?"; tail -3 "$OUT/kernel_tests.log"
  grep -E "Failure|Expected|Which is|rows within|positions compared|greedy steps|error|FAILED|^\[  PASSED|^\[==" "$OUT/engine_tests.log" | head -90
fi
if [ "$WHAT" != tests ]; then
  if [ "$PEER_BATCHES" != none ]; then
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/gpu/hf_peer_engine.py "$OUT/hf_peer.json" "$PEER_BATCHES" > "$OUT/hf_peer.log" 2>&1
    echo "hf peer rc=$?"; tail -5 "$OUT/hf_peer.log"
  fi
  ./build-dev/moebatch_bench_engine_cuda "$OUT/bench_engine_cuda.json" "$OUT/hf_peer.json" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  cat "$OUT/gpu.txt"
  tail -75 "$OUT/bench.log"
fi
