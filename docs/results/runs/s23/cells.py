"""Exact-match % per length for one scheme of a study folder, every view: python cells.py FOLDER SCHEME [CONTEXT=256]."""
import collections, json, sys
from pathlib import Path

folder, scheme = Path(sys.argv[1]), sys.argv[2]
ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 256
for view in ("passkey", "passkey-essay", "passkey-heldout", "niah", "niah-essay"):
    f = folder / f"{view}.jsonl"
    if not f.exists():
        continue
    cells = collections.defaultdict(list)
    for line in f.read_text().splitlines():
        d = json.loads(line)
        if d.get("scheme") == scheme:
            cells[d["length"]].append(d["tf_em"])
    print(f"{view:16s}", "  ".join(f"{n // ctx}x {100 * sum(v) / len(v):.0f}% (n={len(v)})" for n, v in sorted(cells.items())))
