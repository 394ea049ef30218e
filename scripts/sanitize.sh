#!/usr/bin/env bash
# The test suite under sanitizers (CPU build, no CUDA); CI's second and third stages (.ci/run).
#   asan:      ASan + UBSan over the binaries that take outside input or run threads (INPUT_TESTS:
#              queue, ingress, service, tokenizer), in build-asan;
#   asan-full: ASan + UBSan over every test, in build-asan; CI's second stage;
#   tsan:      TSan over the threaded parts (TSAN_TESTS: queue, ingress, service), in build-tsan,
#              with scripts/tsan.supp (library false positives only, each one explained); CI's
#              third stage since 2026-12-03. Eight service tests that check work done within a
#              time budget, or cannot fit ctest's 300 s at TSan's pace, skip themselves there
#              (MB_SKIP_UNDER_TSAN), five give their work a longer deadline (under_tsan or kThreadSanitizer; in
#              tests/service/test_util.h);
#   tsan-ci:   TSan over the queue and ingress binaries only, which need no `moebatch` executable
#              (TSAN_CI_TESTS): a quick local check, about 70 s from a clean build-tsan
#              on the 2-core machine; CI's third stage until 2026-12-03.
# Binaries are picked by the LABELS tests/CMakeLists.txt gives each (its name), so new tests in
# them are covered; only those binaries (and what they start) are built.
# A report fails the run even when it comes from a process the tests start and kill or whose
# exit status they ignore: every report goes to <build>/sanitizer-logs/ (log_path), and the run
# fails when that folder is not empty at the end. UBSan findings abort (MOEBATCH_SANITIZE adds
# -fno-sanitize-recover); ASan and TSan halt on their first report.
# Sanitizer builds use -O1 -g1: half the compile time of -O2 -g, and line tables are all a
# report's stack needs. They are unity builds (MOEBATCH_UNITY: up to 8 sources of a target
# compiled as one translation unit; why and build times: cmake/build_speed.cmake,
# docs/reliability.md), so file-local names (anonymous namespaces, statics) must be unique within
# a target: a clash fails the unity build.
# Extra arguments go to cmake's configure step (CI: -DMOEBATCH_WERROR=ON).
# Usage: scripts/sanitize.sh [asan|asan-full|tsan|tsan-ci|all] [cmake args...]   (default all: asan, tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}
shift || true
CMAKE_ARGS=("$@")
TSAN_TESTS=(test_queue test_queue_cli test_queue_zmq test_zmq test_zmq_process test_service
            test_service_process)
INPUT_TESTS=("${TSAN_TESTS[@]}" test_tokenizer)
TSAN_CI_TESTS=(test_queue test_queue_zmq test_zmq)
case $WHAT in
  asan | asan-full | tsan | tsan-ci | all) ;;
  *) echo "usage: scripts/sanitize.sh [asan|asan-full|tsan|tsan-ci|all] [cmake args...]" >&2; exit 2 ;;
esac
bash scripts/deps.sh

run() {  # run <build dir> <sanitizers> [test binaries: only these are built and run]
  local dir=$1 san=$2
  shift 2
  local start=$SECONDS extra=()
  # GCC warns that TSan does not model std::atomic_thread_fence (Boost.Asio's handler fences);
  # asio's queues are mutex-protected, so the warning, an error under WERROR, is not a finding.
  if [ "$san" = thread ]; then extra=(-DCMAKE_CXX_FLAGS=-Wno-tsan); fi
  cmake -S . -B "$dir" -G Ninja -DMOEBATCH_CUDA=OFF -DMOEBATCH_BUILD_BENCH=OFF -DMOEBATCH_UNITY=ON \
    -DMOEBATCH_SANITIZE="$san" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" "${extra[@]}" "${CMAKE_ARGS[@]}" \
    >/dev/null || return 1
  local targets=() filter=()
  if [ $# -gt 0 ]; then
    targets=(--target "$@")
    filter=(-L "^($(IFS='|'; echo "$*"))\$")
  fi
  # A failed build ends the run here (set -e does not apply inside `run ... || status=1`).
  cmake --build "$dir" -j "$(nproc)" "${targets[@]}" || return 1
  local built=$SECONDS logs
  logs="$(cd "$dir" && pwd)/sanitizer-logs"
  rm -rf "$logs" && mkdir -p "$logs"
  local status=0
  # detect_leaks: processes the tests kill on purpose never get to report.
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan" \
  UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan" \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$logs/tsan:suppressions=$PWD/scripts/tsan.supp" \
    ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" "${filter[@]}" || status=1
  if [ -n "$(ls -A "$logs")" ]; then
    echo "sanitize $san: reports in $logs:"
    for f in "$logs"/*; do echo "== $f"; head -60 "$f"; done
    status=1
  fi
  echo "sanitize $san: build $((built - start)) s, tests $((SECONDS - built)) s"
  return $status
}

status=0
case $WHAT in
  asan | all) run build-asan address,undefined "${INPUT_TESTS[@]}" || status=1 ;;
  asan-full) run build-asan address,undefined || status=1 ;;
esac
if [ "$WHAT" = tsan ] || [ "$WHAT" = all ]; then
  run build-tsan thread "${TSAN_TESTS[@]}" || status=1
elif [ "$WHAT" = tsan-ci ]; then
  run build-tsan thread "${TSAN_CI_TESTS[@]}" || status=1
fi
exit $status
