#!/usr/bin/env bash
# Installs the Debian packages moebatch builds against. Idempotent; needs root or sudo.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config
  libsqlite3-dev sqlite3
  libpq-dev postgresql  # the PostgreSQL job store (libpq) and the server its tests start
  libzmq3-dev cppzmq-dev
  libboost-dev libboost-system-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-jinja2  # the reference the chat template tests compare with (tests/engine)
  libsystemd-dev  # sd_notify for the Type=notify unit (optional: the build goes on without it)
  python3-zmq     # examples/python_producer.py, run by the tests
  systemd         # systemd-analyze: the unit's security rating is checked by the tests
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node.js and npm run the OpenAI SDK test (tests/service/openai; the build installs the SDK with
# `npm ci`). Checked by command, not package: a Node.js from another packager counts too.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
