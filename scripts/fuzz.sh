#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan into build-fuzz, writes
# seed corpora (scripts/fuzz_seeds.py) and runs each target for SECONDS (default 60) on all
# cores but one. Crashes, leaks, timeouts and out-of-memory inputs land in
# build-fuzz/findings/<target>/; the summary line of each run prints at the end. Exit 1 on any
# finding. Installs what it needs: the project's dependencies, clang and libFuzzer (Debian:
# clang libfuzzer-14-dev). Results so far: docs/reliability.md.
# FUZZ_RUNS=N stops each target after N executions instead (SECONDS then bounds it too; 0 = no
# time bound): FUZZ_RUNS=1000000 scripts/fuzz.sh 0 fuzz_gguf.
# Usage: [FUZZ_RUNS=N] scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=${1:-60}
shift || true
bash scripts/deps.sh
fuzzer_rt=(/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a)
if ! command -v "${CXX:-clang++}" >/dev/null 2>&1 || [ ! -f "${fuzzer_rt[0]}" ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    clang libfuzzer-14-dev
fi
BUILD=${BUILD_DIR:-build-fuzz}
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S . -B "$BUILD" -G Ninja -DMOEBATCH_FUZZ=ON \
  -DMOEBATCH_CUDA=OFF -DMOEBATCH_BUILD_TESTS=OFF -DMOEBATCH_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  mapfile -t TARGETS < <(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//' | grep -v fuzz_util)
fi
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"
python3 scripts/fuzz_seeds.py "$BUILD/seeds" .
jobs=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
root=$(cd "$BUILD" && pwd)
status=0
for t in "${TARGETS[@]}"; do
  corpus="$root/corpus/$t" findings="$root/findings/$t"
  mkdir -p "$corpus" "$findings"
  [ -d "$root/seeds/$t" ] && cp -n "$root/seeds/$t"/* "$corpus"/ 2>/dev/null || true
  # -rss_limit_mb / -timeout: an input that makes a parser allocate 2 GB or spin for 10 s is a
  # finding, not a slow run. -max_len 65536: headers, configs and templates fit. Each job logs
  # to fuzz-<n>.log in the working directory.
  extra=()
  if [ -n "${FUZZ_RUNS:-}" ]; then extra+=(-runs="$FUZZ_RUNS"); fi
  case $t in
    # Every input commits to SQLite, whose caches grow between inputs, so libFuzzer would run a
    # full LeakSanitizer scan after almost every one (20 inputs a second instead of ~1000).
    # Leaks are still reported when the process exits, only not pinned to one input.
    fuzz_sql_row) extra+=(-detect_leaks=0) ;;
  esac
  # JSON readers get the dictionary of tokens mutation rarely builds (numbers past double, ...)
  case $t in
    fuzz_model_config|fuzz_safetensors|fuzz_checkpoint_index|fuzz_tokenizer_json|fuzz_api_request| \
    fuzz_batch_line|fuzz_batch_create|fuzz_zmq_request|fuzz_sql_row)
      extra+=(-dict="$PWD/scripts/fuzz_json.dict") ;;
  esac
  started=$SECONDS
  (cd "$root" && rm -f fuzz-*.log &&
   "./$t" "$corpus" -max_total_time="$SECONDS_PER" -jobs="$jobs" -workers="$jobs" \
     -rss_limit_mb=2048 -timeout=10 -max_len=65536 -artifact_prefix="$findings/" \
     -print_final_stats=1 "${extra[@]}" >"$t.log" 2>&1) || status=1
  # The jobs' own logs (fuzz-<n>.log) hold their final stats; the main log may repeat a
  # finished job's log, so it is read only when there are none.
  logs=("$root"/fuzz-*.log)
  [ -f "${logs[0]}" ] || logs=("$root/$t.log")
  execs=$(cat "${logs[@]}" 2>/dev/null |
          grep -o "stat::number_of_executed_units: *[0-9]*" | awk '{s += $2} END {print s + 0}')
  found=$(find "$findings" -type f | wc -l)
  took=$(( SECONDS - started > 0 ? SECONDS - started : 1 ))
  echo "$t: $execs executions ($(( execs / took ))/s) in ${took}s on $jobs job(s)," \
       "$found findings ($findings)"
  [ "$found" -eq 0 ] || status=1
done
exit $status
