"""The BAM GPU checks of issue #16, in one short run: does the FlexAttention path equal the exact
chunked path on CUDA (forward and backward), and how fast does each scheme train relative to RoPE?

    python benchmarks/gpu_check_bam.py --out $OUT/gpu_check_bam.json          # on a CUDA machine
    python benchmarks/gpu_check_bam.py --device cpu --backends eager,chunked  # the same logic on CPU

1. Equivalence: for every setup (ggd+ssmax, ggd+ssmax-content, ggd, alibi, kerple-log, kerple-power,
   fire) one attention call with packed documents (FIRE's query positions restarting in each, as the
   model passes them) and a GQA key/value, computed by each backend of ``--backends`` (default
   ``chunked,flex``: the first is the reference); the largest absolute difference of the output and
   of the gradients of q, k, v, the prior's parameters and the SSMax scales, in float32, and that
   difference relative to the reference's largest magnitude.
2. Throughput: ``benchmarks/train_throughput.py`` on ``--preset`` (default ``120m``, bf16 on CUDA)
   for rope / ggd / ggd+ssmax / alibi / kerple-log / fire, interleaved, tokens per second and the ratio to rope, once
   with the default attention path and once with FlexAttention (``--throughput-backends``).

Everything is written to ``--out`` (JSON) and printed; nothing large is downloaded (random weights).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from posbias.attention import SSMax, attend
from posbias.bam.model import own_positions
from posbias.positional import get_scheme

SETUPS = {"ggd+ssmax": ("ggd", "all"), "ggd+ssmax-content": ("ggd", "content"), "ggd": ("ggd", None),
          "alibi": ("alibi", None), "kerple-log": ("kerple-log", None), "kerple-power": ("kerple-power", None),
          "fire": ("fire", None)}


def _inputs(device, b=2, h=8, h_kv=2, n=512, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, hh, n, d, generator=g).to(device).requires_grad_() for hh in (h, h_kv, h_kv))
    docs = torch.zeros(b, n, dtype=torch.long)
    docs[0, n // 3:], docs[0, 2 * n // 3:], docs[1, n // 2:] = 1, 2, 1  # packed documents
    return q, k, v, docs.to(device)


def _modules(setup: str, heads: int, device):
    pe, scope = SETUPS[setup]
    spec = get_scheme(pe)
    # a GGD prior with varied, non-trivial alpha / beta per head (beta < 0 included), as after training
    ggd = {"ggd_theta_alpha": torch.linspace(-2.0, 1.0, heads).tolist(),
           "ggd_theta_beta": torch.linspace(-0.5, 1.5, heads).tolist()} if pe == "ggd" else {}
    # FIRE's threshold L inside the 512 tokens, so its query-position dependence is exercised
    with torch.random.fork_rng(devices=[]):  # the learnable priors' initialisation, seeded
        torch.manual_seed(0)
        bias = spec.build(num_heads=heads, fire_threshold=64.0, **ggd) if spec.kind == "bias" else None
    ssmax = SSMax(heads, scope=scope) if scope else None
    if ssmax is not None:
        with torch.no_grad():  # varied per-head scales, from an explicit generator
            ssmax.s.copy_(0.5 + torch.rand(heads, generator=torch.Generator().manual_seed(1)))
    return [m.to(device) if m is not None else None for m in (bias, ssmax)]


def equivalence(setup: str, backends: list[str], device) -> dict:
    """Max |difference| to ``backends[0]`` of the output and every gradient, per other backend."""
    q, k, v, docs = _inputs(device)
    bias, ssmax = _modules(setup, q.shape[1], device)
    named = [(f"d{n}", p) for m in (bias, ssmax) if m is not None for n, p in m.named_parameters()]
    params = [p for _, p in named]
    results = {}
    for backend in backends:
        for t in [q, k, v, *params]:
            t.grad = None
        out = attend(q, k, v, bias=bias, doc_ids=docs, normaliser=ssmax, backend=backend, chunk_size=128,
                     query_positions=own_positions(torch.arange(docs.shape[1], device=device), docs))
        (out.float() * torch.linspace(-1, 1, out.shape[-1], device=device)).sum().backward()
        results[backend] = [out.detach().float(), *[t.grad.detach().float() for t in [q, k, v, *params]]]
    ref = results[backends[0]]
    names = ["out", "dq", "dk", "dv"] + [n for n, _ in named]
    # parameter gradients relative to the prior's largest one: some are zero in exact arithmetic (FIRE's
    # per-head output bias shifts a whole row of logits, which softmax cancels), so their own size is
    # rounding noise
    floor = [0.0] * 4 + [max((float(y.abs().max()) for y in ref[4:]), default=0.0)] * len(named)
    return {b: {name: {"abs": float((x - y).abs().max()),
                       "rel": float((x - y).abs().max() / y.abs().max().clamp(min=max(lo, 1e-12)))}
                for name, x, y, lo in zip(names, got, ref, floor)}
            for b, got in results.items() if b != backends[0]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backends", default="chunked,flex", help="attention backends; the first is the reference")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--preset", default="120m")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--throughput-backends", default="auto,flex", help="'' skips the throughput part")
    ap.add_argument("--out", default="gpu_check_bam.json")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    backends = [b for b in a.backends.split(",") if b]
    if "flex" in backends and device.type != "cuda":
        raise SystemExit("error: backend flex needs a CUDA device (give --device cpu --backends eager,chunked to "
                         "check the comparison on CPU)")
    report: dict = {"device": str(device), "torch": torch.__version__, "equivalence": {}, "throughput": {}}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    for setup in [s for s in a.setups.split(",") if s]:
        t = time.perf_counter()
        report["equivalence"][setup] = equivalence(setup, backends, device)
        print(f"{setup:<20} {json.dumps(report['equivalence'][setup])}  ({time.perf_counter() - t:.1f} s)")
    for backend in [b for b in a.throughput_backends.split(",") if b]:
        from train_throughput import main as throughput  # noqa: PLC0415 (script: benchmarks/ is on sys.path when run as a script)

        args = ["--preset", a.preset, "--context", str(a.context), "--batch-size", str(a.batch_size),
                "--setups", "rope,ggd,ggd+ssmax,alibi,kerple-log,fire", "--device", str(device), "--backend", backend]
        report["throughput"][backend] = throughput(args + (["--bf16"] if device.type == "cuda" else []))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
