"""Held-out perplexity (non-overlapping / sliding) at 1x, 4x, 16x, 64x for every model of the given study folders."""
import json, sys
ctx = [256, 1024, 4096, 16384]
print("| folder | model | " + " | ".join(f"{c // 256}x" for c in ctx) + " |")
for f in sys.argv[1:]:
    by = {}
    for l in open(f + "/perplexity.jsonl"):
        r = json.loads(l)
        by.setdefault(r["model"], {})[(r["context"], r["mode"])] = r["ppl"]
    for m, d in by.items():
        cells = [f"{d.get((c, 'non-overlapping'), float('nan')):,.0f} / {d.get((c, 'sliding'), float('nan')):,.0f}" for c in ctx]
        print(f"| {f.split('/')[-1]} | {m} | " + " | ".join(cells) + " |")
