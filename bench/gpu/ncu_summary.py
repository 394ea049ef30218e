"""Per-kernel totals of one profiled decode step from `ncu --csv --metrics gpu__time_duration.sum`
(bench_engine_cuda's profiler range): calls, total and mean µs per kernel name, largest first."""
import csv
import sys
from collections import defaultdict

SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
tot, cnt = defaultdict(float), defaultdict(int)
with open(sys.argv[1], newline="") as f:
    rows = [r for r in csv.reader(line for line in f if line.startswith('"'))]
head, body = rows[0], rows[1:]
name_i, unit_i, val_i = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
for r in body:
    name = r[name_i].split("(")[0][:70]
    tot[name] += float(r[val_i].replace(",", "")) * SCALE.get(r[unit_i], 1.0)
    cnt[name] += 1
total = sum(tot.values())
print(f"{'kernel':70s} {'calls':>6s} {'total us':>10s} {'mean us':>8s}")
for name in sorted(tot, key=tot.get, reverse=True):
    print(f"{name:70s} {cnt[name]:6d} {tot[name]:10.1f} {tot[name] / cnt[name]:8.2f}")
print(f"{'sum of kernel time (one step)':70s} {sum(cnt.values()):6d} {total:10.1f}")
