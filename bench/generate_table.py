"""Reads bench-generate and llama_cpp_baseline JSON lines (several rounds) on
stdin and prints the median of each figure as a table, with ratios against
one sequence of the same engine and weights, and against llama.cpp at the
same phase and number of sequences."""
import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        runs[(r["engine"], r["weights"], r["phase"], r["concurrency"])].append(r)

def rate(key):
    rs = runs.get(key)
    if not rs:
        return None
    return statistics.median(r["tokens"] / r["seconds"] for r in rs)

print("| engine | weights | phase | sequences | tokens/s | vs 1 sequence | vs llama.cpp (same sequences) |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
for key in sorted(runs, key=lambda k: (k[0] != "llama.cpp", k[1], k[2] != "prompt", k[3])):
    engine, weights, phase, n = key
    r = rate(key)
    single = rate((engine, weights, phase, 1))
    vs_one = f"{r / single:.2f}x" if phase == "decode" and single else "-"
    base = rate(("llama.cpp", "as stored", phase, n))
    vs_llama = f"{r / base:.2f}x" if base else "-"
    print(f"| {engine} | {weights} | {phase} | {n} | {r:.1f} | {vs_one} | {vs_llama} |")
rounds = max(len(v) for v in runs.values()) if runs else 0
print(f"(median of {rounds} interleaved round(s))")
