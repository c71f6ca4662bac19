"""Training throughput (tokens/s, forward + backward + AdamW step) of positional schemes at the
same model size, measured in one interleaved run so machine noise hits all of them alike.

    .venv/bin/python benchmarks/train_throughput.py --preset tiny --context 256 --batch-size 4

Prints a table and the ratio of every scheme to RoPE (target: ggd+ssmax within 1.3x of rope).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from posbias.bam import BamConfig, BamForCausalLM

SETUPS = {"rope": ("rope", "softmax"), "nope": ("nope", "softmax"), "alibi": ("alibi", "softmax"),
          "ggd": ("ggd", "softmax"), "ggd+ssmax": ("ggd", "ssmax"), "kerple-log": ("kerple-log", "softmax"),
          "kerple-power": ("kerple-power", "softmax"), "fire": ("fire", "softmax")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per scheme and round")
    ap.add_argument("--setups", default="ggd+ssmax,ggd,rope,nope")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    ap.add_argument("--backend", default="auto", help="attention backend (auto / sdpa / flex / chunked)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    names = a.setups.split(",")
    models, opts = {}, {}
    for name in names:
        pe, norm = SETUPS[name]
        over = {"num_hidden_layers": a.layers} if a.layers else {}
        torch.manual_seed(0)
        cfg = BamConfig.from_preset(a.preset, pe=pe, normaliser=norm, vocab_size=a.vocab, attn_backend=a.backend,
                                    **over)
        models[name] = BamForCausalLM(cfg).to(dev).train()
        opts[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch_size, a.context), generator=g).to(dev)
    docs = torch.zeros_like(x)
    docs[:, a.context // 2:] = 1  # two packed documents per row, as in training
    ctx = torch.autocast(dev.type, dtype=torch.bfloat16) if a.bf16 else torch.autocast(dev.type, enabled=False)

    def step(name):
        with ctx:
            loss = models[name](input_ids=x, doc_ids=docs, labels=x, use_cache=False).loss
        loss.backward()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for name in names:  # warmup (and compilation for flex)
        step(name)
    sync()
    times = {n: [] for n in names}
    for _ in range(a.rounds):
        for name in names:
            sync()
            t = time.perf_counter()
            for _ in range(a.steps):
                step(name)
            sync()
            times[name].append((time.perf_counter() - t) / a.steps)
    tokens = a.batch_size * a.context
    res = {n: {"tokens_per_s": tokens / statistics.median(ts), "s_per_step": statistics.median(ts)}
           for n, ts in times.items()}
    ref = res.get("rope", {}).get("s_per_step")
    print(f"preset={a.preset} context={a.context} batch={a.batch_size} device={dev} threads={a.threads} "
          f"rounds={a.rounds}x{a.steps}")
    print(f"{'scheme':<12}{'tokens/s':>12}{'s/step':>10}{'x rope':>9}")
    for n, r in res.items():
        ratio = r["s_per_step"] / ref if ref else float("nan")
        r["slowdown_vs_rope"] = ratio
        print(f"{n:<12}{r['tokens_per_s']:>12,.0f}{r['s_per_step']:>10.4f}{ratio:>9.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": res}, f, indent=2)
    return res


if __name__ == "__main__":
    main()
