#!/usr/bin/env python3
"""Fits the h200-llama3-8b cost model (sim/src/cost.rs) to data/measurements/h200/*.jsonl.

Terms (milliseconds): floor + prefill token + decode request + cached token read by a decode step
+ attention pair of a chunk (chunk x prior + chunk^2 / 2), plus two terms for the mixed measurements'
masked chunk-attention kernel (extra per pair, extra per step), which only `kvsched cost --points`
uses. Decode points: the CUDA-graph replays (what serving engines run); prefill and mixed points as
measured. Least squares on relative error. Prints the coefficients in microseconds, as cost.rs has them.
No dependencies beyond the standard library.
"""
import json, pathlib, sys

root = pathlib.Path(__file__).resolve().parent.parent / "data" / "measurements" / "h200"
points = []
for name in ["llama3-8b-decode-graphs.jsonl", "llama3-8b-steps.jsonl", "llama3-8b-mixed-steps.jsonl"]:
    for line in open(root / name):
        d = json.loads(line)
        kind = d.get("kind")
        if kind in (None, "decode"):  # header lines; eager decodes are reported, not fitted
            continue
        if kind == "decode_graph":
            b, l, c, p = d["batch"], d["context"], 0, 0
        elif kind == "prefill":
            b, l, c, p = 0, 0, d["tokens"], 0
        else:
            b, l, c, p = d["decode_batch"], d["decode_context"], d["chunk"], d["chunk_prior_context"]
        points.append((kind, b, l, c, p, d["ms_median"]))

def features(kind, b, l, c, p):
    masked = 1.0 if kind == "mixed" and c > 0 else 0.0
    pairs = c * p + c * c / 2
    return [1.0, c, b, b * l, pairs, masked * pairs, masked]

def solve(rows, rhs):
    n = len(rows[0])
    m = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    v = [sum(r[i] * y for r, y in zip(rows, rhs)) for i in range(n)]
    for i in range(n):
        k = max(range(i, n), key=lambda r: abs(m[r][i]))
        m[i], m[k], v[i], v[k] = m[k], m[i], v[k], v[i]
        for r in range(n):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [a - f * b for a, b in zip(m[r], m[i])]
                v[r] -= f * v[i]
    return [v[i] / m[i][i] for i in range(n)]

w = solve([[x / pt[5] for x in features(*pt[:5])] for pt in points], [1.0] * len(points))
names = ["step_us", "prefill_us_per_token", "decode_us_per_request", "decode_us_per_cached_token",
         "attention_us_per_pair", "MASKED_US_PER_PAIR", "MASKED_STEP_US"]
for n, x in zip(names, w):
    print(f"{n:28} {x * 1000:.6g}")
errs = sorted(abs(sum(a * b for a, b in zip(w, features(*pt[:5]))) - pt[5]) / pt[5] for pt in points)
print(f"{len(points)} points fitted: median error {100 * errs[len(errs) // 2]:.1f} %, largest {100 * errs[-1]:.1f} %",
      file=sys.stderr)
