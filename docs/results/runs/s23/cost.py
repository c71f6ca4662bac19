"""Seconds and peak RSS (MB) per instance at one length, per view: python cost.py FOLDER SCHEME LENGTH."""
import json, sys
from pathlib import Path

folder, scheme, length = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for view in ("passkey", "passkey-essay", "passkey-heldout", "niah", "niah-essay"):
    f = folder / f"{view}.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
    rows = [r for r in rows if r.get("scheme") == scheme and int(r["length"]) == length]
    if rows:
        sec = sorted(r["seconds"] for r in rows)
        mem = [r["peak_rss_mb"] for r in rows]
        print(f"{view:16s} n={len(rows)} seconds {sec[0]:.0f}-{sec[-1]:.0f} (median {sec[len(sec) // 2]:.0f}), peak RSS {min(mem):.0f}-{max(mem):.0f} MB")
