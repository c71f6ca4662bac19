"""Exact-match % per length for one scheme of a study folder, every view: python cells.py FOLDER SCHEME."""
import collections, json, sys
from pathlib import Path

folder, scheme = Path(sys.argv[1]), sys.argv[2]
for view in ("passkey", "passkey-essay", "passkey-heldout", "niah", "niah-essay"):
    f = folder / f"{view}.jsonl"
    if not f.exists():
        continue
    cells = collections.defaultdict(list)
    for line in f.read_text().splitlines():
        d = json.loads(line)
        if d.get("scheme") == scheme:
            cells[d["length"]].append(d["tf_em"])
    print(f"{view:16s}", "  ".join(f"{n // 256}x {100 * sum(v) / len(v):.0f}% (n={len(v)})" for n, v in sorted(cells.items())))
