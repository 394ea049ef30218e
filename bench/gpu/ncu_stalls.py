"""The instructions of one kernel that hold the most warp-stall samples, from the CSV of
`ncu -i REPORT --page source --print-source sass --csv` (a report collected with
`--section SourceCounters`): each row's SASS and its samples, most first, with the share of the
kernel's samples, until `--cover` of them (default 0.8) or `--rows` rows (default 40)."""
import argparse
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv_file")
    ap.add_argument("--cover", type=float, default=0.8)
    ap.add_argument("--rows", type=int, default=40)
    a = ap.parse_args()
    with open(a.csv_file, newline="") as f:
        rows = [r for r in csv.reader(line for line in f if line.startswith('"'))]
    if not rows:
        sys.exit("no CSV rows (was the report collected with --section SourceCounters?)")
    # ncu puts a "Kernel Name" line above the column header: the header is the first row
    # that names the stall-sampling column.
    at = next((i for i, r in enumerate(rows) if any(h.startswith("Warp Stall Sampling (All") for h in r)), 0)
    head, body = rows[at], rows[at + 1:]
    samples = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
    source = next((i for i, h in enumerate(head) if h in ("Source", "SASS")), None)
    address = next((i for i, h in enumerate(head) if h.startswith("Address")), None)
    if samples is None or source is None:
        sys.exit(f"columns not found; the header is: {head}")
    total = sum(number(r[samples]) for r in body if len(r) > samples)
    if total <= 0:
        sys.exit("no stall samples in the report")
    print(f"{'address':>8s} {'samples':>9s} {'share':>6s} {'cum':>6s}  sass")
    cum = 0.0
    for n, r in enumerate(sorted(body, key=lambda r: number(r[samples]), reverse=True)):
        if n >= a.rows or cum >= a.cover:
            break
        cum += number(r[samples]) / total
        where = r[address] if address is not None else ""
        print(f"{where:>8s} {number(r[samples]):9.0f} {number(r[samples]) / total:6.1%} {cum:6.1%}  {r[source].strip()}")


if __name__ == "__main__":
    main()
