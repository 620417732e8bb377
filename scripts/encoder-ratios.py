#!/usr/bin/env python3
"""Ratios of the `encoders` criterion bench (crates/kvgate-tokenize/benches/encoders.rs):
for each text class and length, the throughput of fastokens and of kvgate's chosen
path over `tokenizers`', and kvgate's over fastokens'. Reads criterion's estimates
under target/criterion (or the directory given) and prints a markdown table.

    cargo bench -p kvgate-tokenize --bench encoders && python3 scripts/encoder-ratios.py
"""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
CLASSES = ["prose", "code", "cjk", "randtok"]
LENGTHS = ["1k", "4k", "32k", "128k"]


def mean_ns(group, name, length):
    p = root / f"encode_{group}" / name / length / "new" / "estimates.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())["mean"]["point_estimate"]


print("| class | tokens | tokenizers (ms) | fastokens ÷ tokenizers | kvgate ÷ tokenizers | kvgate ÷ fastokens |")
print("|---|---|---|---|---|---|")
for c in CLASSES:
    for n in LENGTHS:
        t = mean_ns(c, "tokenizers", n)
        f = mean_ns(c, "fastokens", n)
        k = mean_ns(c, "kvgate", n)
        if None in (t, f, k):
            continue
        # Throughput ratios: time of the slower over time of the other.
        print(f"| {c} | {n} | {t / 1e6:.2f} | {t / f:.1f}× | {t / k:.1f}× | {f / k:.2f}× |")
