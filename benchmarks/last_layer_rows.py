"""Time of a BAM forward pass with only the last positions' logits kept, against the full last layer.

``logits_to_keep=k`` (an int) makes the last decoder layer compute queries, MLP and output for the last
``k`` rows alone (``BamModel.forward(rows_to_keep=k)``); a LongTensor of the same positions keeps the
logits but runs the whole last layer, so the two calls differ in that alone. They alternate, ``--repeats``
times each, in one process; the ratio of their summed times is reported with the largest logit difference.

    .venv/bin/python benchmarks/last_layer_rows.py experiments/extrapolation-1000x/models/c128-s0-ggd \\
        --length 8192 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a BAM model folder (posbias train / study output, or a kept model)")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--keep", type=int, default=6, help="logits kept (teacher-forced passkey: 6)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()

    import torch  # noqa: PLC0415 (heavy: after argument parsing)

    from posbias.models import load_model  # noqa: PLC0415 (heavy: after argument parsing)

    model, _ = load_model(a.model, require_rope=False)
    x = torch.randint(5, model.config.vocab_size, (1, a.length), generator=torch.Generator().manual_seed(0))
    calls = {"rows kept": a.keep, "full last layer": torch.arange(a.length - a.keep, a.length)}
    seconds = {name: [] for name in calls}
    logits = {}
    with torch.no_grad():
        for _ in range(a.repeats):
            for name, keep in calls.items():
                start = time.perf_counter()
                logits[name] = model(input_ids=x, logits_to_keep=keep, use_cache=False).logits
                seconds[name].append(round(time.perf_counter() - start, 3))
    print(json.dumps({"length": a.length, "threads": torch.get_num_threads(), "seconds": seconds,
                      "ratio": sum(seconds["rows kept"]) / sum(seconds["full last layer"]),
                      "max_abs_logit_difference": float((logits["rows kept"] - logits["full last layer"]).abs().max())},
                     indent=1))


if __name__ == "__main__":
    main()
