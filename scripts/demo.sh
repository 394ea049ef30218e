#!/usr/bin/env bash
# One command from a fresh machine to the main job: dependencies, build, `moebatch demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
exec ./"${BUILD_DIR:-build}"/moebatch demo "$@"
