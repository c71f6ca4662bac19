"""Last training step and the probes so far of each model in the given study folders."""
import glob, json, sys
for f in sys.argv[1:]:
    for m in sorted(glob.glob(f + "/models/*/metrics.jsonl")):
        rows = [json.loads(l) for l in open(m) if l.strip()]
        probes = [(r["step"], round(100 * r["passkey_em"]), round(100 * r.get("niah_em", -0.01)))
                  for r in rows if "passkey_em" in r]
        print(m, "step", max((r.get("step", 0) for r in rows), default=0), "probes (step, passkey, niah):", probes[-8:])
