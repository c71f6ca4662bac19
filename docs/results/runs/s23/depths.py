"""Hits per depth at one length, per view: python depths.py FOLDER SCHEME LENGTH."""
import collections, json, sys
from pathlib import Path

folder, scheme, length = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for view in ("passkey", "passkey-essay", "passkey-heldout", "niah", "niah-essay"):
    f = folder / f"{view}.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
    cells = collections.defaultdict(list)
    for r in rows:
        if r.get("scheme") == scheme and int(r["length"]) == length:
            cells[r["depth"]].append(r["tf_em"])
    if cells:
        print(f"{view:16s}", "  ".join(f"depth {d}: {sum(v)}/{len(v)}" for d, v in sorted(cells.items())))
