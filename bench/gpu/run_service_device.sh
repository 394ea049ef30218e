#!/usr/bin/env bash
# The service on the GPU machine, end to end, on random weights of the Qwen3-30B-A3B shape: the
# offline workload through the SQLite queue (bench/offline, 1024/128 and 4096/256), then 64
# concurrent streaming clients on the OpenAI API (bench/service/stream_load.py). Needs the
# carried .devdebs (docs/device.md of the shared docs: ZeroMQ, SQLite, PCRE2, utf8proc).
# Results (JSON + logs) land in $OUT; a summary prints last.
# Usage: bench/gpu/run_service_device.sh [REQUESTS_1024=1024] [REQUESTS_4096=256]
# STREAM=0 skips the streaming clients. ARCH=qwen3_next (or qwen3_moe) first runs the end-to-end
# service check (tests/gpu/service_e2e.sh, --backend cuda, E2E_JOBS jobs, default 200) on that
# demo model; E2E_ONLY=1 stops after it. MODEL (default random:qwen3-30b-a3b) and QUANT (default
# auto; e.g. nvfp4 for the seed-class shape on one GPU) pick the offline model.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/svc_out}
N1=${1:-1024}
N4=${2:-256}
mkdir -p "$OUT"
. bench/devdebs_env.sh
B=build-svc
if ! cmake -S . -B $B -G Ninja -DMOEBATCH_CUDA=ON -DMOEBATCH_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=$D \
     > "$OUT/build.log" 2>&1 ||
   ! cmake --build $B -j 16 --target moebatch moebatch_bench_offline >> "$OUT/build.log" 2>&1; then
  grep -iE "error" -A3 "$OUT/build.log" | head -40; exit 1
fi
echo "built $(date +%T)"
if [ -n "${ARCH:-}" ]; then
  ARCH=$ARCH timeout 300 tests/gpu/service_e2e.sh $B cuda "${E2E_JOBS:-200}" > "$OUT/service_e2e_$ARCH.log" 2>&1
  echo "service_e2e ARCH=$ARCH rc=$?"; tail -8 "$OUT/service_e2e_$ARCH.log"
  [ "${E2E_ONLY:-0}" = 1 ] && exit 0
fi
MODEL=${MODEL:-random:qwen3-30b-a3b}
TOK=tests/data/qwen3-tokenizer
COMMON=(--model $MODEL --tokenizer $TOK --backend cuda --max-num-seqs 256 --max-num-batched-tokens 8192
        --quantization "${QUANT:-auto}")
timeout 200 ./$B/moebatch_bench_offline "${COMMON[@]}" --requests "$N1" --input-len 1024 --output-len 128 \
  --out "$OUT/offline_1024_128.json" > "$OUT/offline_1024_128.log" 2>&1
echo "offline 1024/128 rc=$?"; tail -12 "$OUT/offline_1024_128.log"
if [ "$N4" -gt 0 ]; then
  timeout 200 ./$B/moebatch_bench_offline "${COMMON[@]}" --requests "$N4" --input-len 4096 --output-len 256 \
    --out "$OUT/offline_4096_256.json" > "$OUT/offline_4096_256.log" 2>&1
  echo "offline 4096/256 rc=$?"; tail -12 "$OUT/offline_4096_256.log"
fi

# streaming clients on the OpenAI API
[ "${STREAM:-1}" = 0 ] && exit 0
W=$(mktemp -d)
./$B/moebatch serve "${COMMON[@]}" --db "$W/jobs.db" --bind tcp://127.0.0.1:0 --http-port 0 \
  --ready-file "$W/ready.json" > "$OUT/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 900); do [ -s "$W/ready.json" ] && break; kill -0 $PID 2>/dev/null || break; sleep 0.1; done
if [ -s "$W/ready.json" ]; then
  PORT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["http_port"])' "$W/ready.json")
  ID=$(python3 -c 'import json,sys,urllib.request; print(json.load(urllib.request.urlopen(sys.argv[1]))["data"][0]["id"])' \
    "http://127.0.0.1:$PORT/v1/models")
  timeout 200 python3 bench/service/stream_load.py "http://127.0.0.1:$PORT/v1" "$ID" --clients 64 --requests 4 \
    --max-tokens 64 | tee "$OUT/stream_load.json"
else
  echo "serve did not become ready"; tail -20 "$OUT/serve.log"
fi
kill $PID 2>/dev/null; wait $PID 2>/dev/null
rm -rf "$W"
