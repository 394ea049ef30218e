#!/usr/bin/env python3
"""Times Hugging Face `tokenizers` on the texts bench_tokenizer wrote (--corpus-dir), in the
same run as ours, checks that its ids equal ours on every text, and prints both with the ratio.

  python3 hf_peer.py --tokenizer-json DIR/tokenizer.json --corpus-dir D --ours ours.json
"""
import argparse
import array
import json
import os
import sys
import time

# Single-threaded, like bench_tokenizer (must be set before tokenizers is imported).
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

TEXTS = ["mixed", "english", "chinese", "code", "unicode"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-json", required=True)
    ap.add_argument("--corpus-dir", required=True)
    ap.add_argument("--ours", required=True, help="JSON written by bench_tokenizer")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--out", default="hf_peer.json")
    a = ap.parse_args()

    ours = {r["name"]: r for r in json.load(open(a.ours))["rows"]}
    tk = Tokenizer.from_file(a.tokenizer_json)
    rows, mismatches = [], 0
    for name in TEXTS:
        path = os.path.join(a.corpus_dir, name + ".txt")
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")
        timings = []
        enc = None
        for _ in range(a.iters + (1 if name == "mixed" else 0)):
            t0 = time.perf_counter()
            enc = tk.encode(text)
            timings.append(time.perf_counter() - t0)
        if name == "mixed":  # first call on a fresh tokenizer: empty word cache
            rows.append(("mixed (cold)", len(raw), timings[0]))
            timings = timings[1:]
        rows.append((name, len(raw), min(timings)))
        ref = array.array("I")
        with open(os.path.join(a.corpus_dir, name + ".ids.u32"), "rb") as f:
            ref.frombytes(f.read())
        same = list(ref) == enc.ids
        if not same:
            mismatches += 1
            first = next((i for i, (x, y) in enumerate(zip(ref, enc.ids)) if x != y),
                         min(len(ref), len(enc.ids)))
            print(f"IDS DIFFER on {name}: ours {len(ref)} ids, hf {len(enc.ids)}, first diff at "
                  f"{first}: ours {list(ref[first:first + 5])} hf {enc.ids[first:first + 5]}")
        else:
            print(f"ids identical on {name} ({len(ref)} ids)")

    print(f"tokenizers {tokenizers.__version__}, single thread, best of {a.iters}")
    print(f"{'text':<14} {'MiB':>6} {'ours MB/s':>10} {'HF MB/s':>9} {'ours/HF':>8}")
    out = {"tokenizers_version": tokenizers.__version__, "ids_mismatches": mismatches, "rows": []}
    for name, nbytes, secs in rows:
        hf = nbytes / 1e6 / secs
        mine = ours.get(name, {}).get("mb_per_s")
        ratio = mine / hf if mine else float("nan")
        print(f"{name:<14} {nbytes / 2**20:>6.2f} {mine or float('nan'):>10.2f} {hf:>9.2f} "
              f"{ratio:>8.2f}")
        out["rows"].append({"name": name, "bytes": nbytes, "hf_mb_per_s": hf,
                            "ours_mb_per_s": mine, "ratio": ratio})
    json.dump(out, open(a.out, "w"), indent=2)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
