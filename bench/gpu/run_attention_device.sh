#!/usr/bin/env bash
# One device call for the prefill attention kernels (docs/kernels.md, docs/design.md): the
# engine-only build, every attention op case, the attn_prefill rows (the engine's pick against
# mma.sync / the CUDA-core kernel), then ncu's per-instruction warp-stall samples of the wgmma
# kernel at 8 × 1024 tokens (30B shape), summed by bench/gpu/ncu_stalls.py. Logs land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/attn_out}
mkdir -p "$OUT"
if ! cmake -S . -B build-dev -G Ninja -DMOEBATCH_ENGINE_ONLY=ON -DMOEBATCH_CUDA=ON > "$OUT/build.log" 2>&1 ||
   ! cmake --build build-dev -j16 --target moebatch_gpu_tests moebatch_bench_kernels >> "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1
fi
timeout 150 ./build-dev/moebatch_gpu_tests --gtest_filter='*attn*' > "$OUT/tests.log" 2>&1
rc=$?
echo "attention op cases rc=$rc"
grep -E "FAILED|^\[  PASSED|^\[==|Failure" "$OUT/tests.log" | head -30
[ $rc -eq 0 ] || exit 1
timeout 150 ./build-dev/moebatch_bench_kernels "$OUT/attn_rows.json" --filter attn_prefill > "$OUT/rows.log" 2>&1
echo "rows rc=$?"; grep -E "attn_prefill" "$OUT/rows.log"
timeout 200 ncu --section SourceCounters --section SpeedOfLight --import-source yes -k regex:attention_prefill_wgmma \
  --launch-skip 3 --launch-count 1 --clock-control none -o /tmp/attn_src -f \
  ./build-dev/moebatch_bench_kernels /tmp/n.json --filter "attn_prefill 8x1024 causal" > "$OUT/ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i /tmp/attn_src.ncu-rep --page source --print-source sass --csv > "$OUT/ncu_source.csv" 2>&1
python3 bench/gpu/ncu_stalls.py "$OUT/ncu_source.csv" | tee "$OUT/stalls.txt"
