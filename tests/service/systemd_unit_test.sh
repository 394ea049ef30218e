#!/usr/bin/env bash
# deploy/moebatch.service: the directives the service relies on are there, and
# `systemd-analyze security` rates the unit at most 4.0, as shipped (CPU) and with its CUDA
# block applied. Exits 77 (skipped) without systemd-analyze.
set -euo pipefail
unit="$1"
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for want in '^Type=notify$' '^WatchdogSec=' '^NotifyAccess=main$' '^StateDirectory=moebatch$' \
    '^LogsDirectory=moebatch$' '^RestartPreventExitStatus=2$' '^LimitNOFILE=' '^Restart=on-failure$'; do
  grep -q "$want" "$unit" || { echo "FAIL: $unit lacks $want"; exit 1; }
done

cp "$unit" "$work/moebatch.service"
# The CUDA variant: the commented replacements applied, as the comment tells an operator to.
sed -e 's/^PrivateDevices=yes/PrivateDevices=no/' -e 's/^PrivateUsers=yes/PrivateUsers=no/' \
    -e 's/^MemoryDenyWriteExecute=yes/MemoryDenyWriteExecute=no/' \
    -e 's/^RestrictAddressFamilies=.*//' -e 's/^# \(RestrictAddressFamilies=\)/\1/' \
    -e 's/^# \(DevicePolicy=\)/\1/' -e 's/^# \(DeviceAllow=\)/\1/' \
    -e 's/^# \(PrivateDevices=no\)//' -e 's/^# \(PrivateUsers=no\)//' \
    -e 's/^# \(MemoryDenyWriteExecute=no\)//' "$unit" > "$work/moebatch-cuda.service"
grep -q '^DeviceAllow=char-nvidia-uvm' "$work/moebatch-cuda.service" ||
  { echo "FAIL: the CUDA block did not apply"; exit 1; }

status=0
for u in moebatch.service moebatch-cuda.service; do
  out=$(cd "$work" && systemd-analyze security --offline=true "$u" 2>&1) || true
  level=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
  if [ -z "$level" ]; then
    echo "FAIL: no exposure level for $u:"; printf '%s\n' "$out"; status=1; continue
  fi
  # Directives systemd does not know are reported on stderr as "Unknown key name".
  if printf '%s\n' "$out" | grep -qi 'unknown key\|failed to parse'; then
    echo "FAIL: $u has directives systemd rejects:"; printf '%s\n' "$out" | grep -i 'unknown key\|failed to parse'
    status=1
  fi
  echo "$u: exposure $level"
  awk -v l="$level" 'BEGIN { exit !(l <= 4.0) }' || { echo "FAIL: $u rated $level > 4.0"; status=1; }
done
exit $status
