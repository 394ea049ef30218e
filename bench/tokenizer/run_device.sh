#!/usr/bin/env bash
# Peer comparison on the GPU machine (which has Hugging Face tokenizers 0.23 but lacks the
# PCRE2/utf8proc headers): unpack the carried .debs (../shared/docs/device.md), build only
# bench_tokenizer, run it, then time HF tokenizers on the very same texts with hf_peer.py and
# check its ids equal ours. Results land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tok_out}
mkdir -p "$OUT"
. bench/devdebs_env.sh
B=build-tokdev
BIN=$B/bench_tokenizer
if cmake -S . -B $B -G Ninja -DMOEBATCH_CUDA=OFF -DMOEBATCH_ENGINE_ONLY=OFF \
     -DMOEBATCH_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=$D >"$OUT/configure.log" 2>&1 &&
   cmake --build $B -j 16 --target bench_tokenizer >>"$OUT/configure.log" 2>&1; then
  echo "built with CMake"
else
  # Fallback: the same sources and flags as the CMake target (RelWithDebInfo), by hand.
  echo "CMake configure/build failed (see configure.log); compiling directly"
  mkdir -p $B
  g++ -std=c++20 -O2 -g -DNDEBUG -I. -I$D/include \
    -DMOEBATCH_TEST_DATA="\"$PWD/tests/data\"" \
    engine/tokenizer/*.cpp common/*.cpp bench/tokenizer/*.cpp -o $BIN \
    -L$LIB -lpcre2-8 -lutf8proc -lspdlog -lfmt -pthread >>"$OUT/configure.log" 2>&1 ||
    { tail -30 "$OUT/configure.log"; exit 1; }
fi
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"
taskset -c 2 $BIN --json "$OUT/bench_tokenizer.json" --corpus-dir /tmp/tokcorpus --iters 3 |
  tee "$OUT/bench_tokenizer.txt"
taskset -c 2 python3 bench/tokenizer/hf_peer.py \
  --tokenizer-json tests/data/qwen3-tokenizer/tokenizer.json --corpus-dir /tmp/tokcorpus \
  --ours "$OUT/bench_tokenizer.json" --out "$OUT/hf_peer.json" --iters 3 |
  tee "$OUT/hf_peer.txt"
