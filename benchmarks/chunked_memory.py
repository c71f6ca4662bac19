"""Peak memory of long-context inference with the exact query-chunked attention path.

Each measurement runs in a fresh subprocess: build a BAM model (GGD prior + SSMax by default),
run one forward pass over N tokens with ``attn_backend="chunked"`` and ``logits_to_keep=1`` under
``torch.no_grad()``, and report the peak resident memory above the level before the forward
(``posbias.utils.memory.peak_rss_mb`` after ``reset_peak_rss``; tracemalloc does not see torch's
allocator), with the allocator settings the package itself applies (``keep_freed_memory``), so the
figure is what a ``posbias study`` run gets. On CUDA ``torch.cuda.max_memory_allocated`` is reported
instead.

    .venv/bin/python benchmarks/chunked_memory.py --lengths 8192,32768

Memory should grow about linearly with N (activations O(N d) + one chunk's scores
O(chunk x N x heads)), where full attention needs O(N^2 x heads).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _measure(a) -> dict:
    import torch  # noqa: PLC0415 (heavy: only the measuring child process loads torch)

    from posbias.bam import BamConfig, BamForCausalLM  # noqa: PLC0415 (heavy: only the measuring child process loads torch)
    from posbias.utils.memory import peak_rss_mb, reset_peak_rss  # noqa: PLC0415 (heavy: only the measuring child process loads torch)

    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    cfg = BamConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                    num_attention_heads=a.heads, intermediate_size=4 * a.hidden, pe=a.pe, normaliser=a.normaliser,
                    attn_backend=a.backend, attn_chunk_size=a.chunk)
    model = BamForCausalLM(cfg).to(dev).eval()
    x = torch.randint(0, a.vocab, (1, a.length), device=dev)
    with torch.no_grad():
        model(x[:, :64], use_cache=False)  # warm up allocator / kernels
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    reset_peak_rss()
    rss0 = peak_rss_mb()
    t = time.perf_counter()
    with torch.no_grad():
        out = model(x, use_cache=False, logits_to_keep=1)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    res = {"length": a.length, "backend": a.backend, "chunk": a.chunk, "seconds": dt,
           "finite": bool(torch.isfinite(out.logits).all())}
    if dev.type == "cuda":
        res["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        res["peak_mib"] = peak_rss_mb() - rss0
        res["rss_before_mib"] = rss0
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--backend", default="chunked", help="chunked (default) or sdpa for a full-attention contrast")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--pe", default="ggd")
    ap.add_argument("--normaliser", default="ssmax")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--length", type=int, default=None, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.length is not None:
        print(json.dumps(_measure(a)))
        return None
    results = []
    passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                   if k not in ("lengths", "length", "json")]
    for n in [int(v) for v in a.lengths.split(",")]:
        out = subprocess.run([sys.executable, __file__, f"--length={n}", *passthrough], capture_output=True,
                             text=True)
        if out.returncode != 0:
            print(f"length {n}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        full_mib = n * n * a.heads * 4 / 2**20  # one float32 [heads, N, N] score matrix
        r["full_scores_mib"] = full_mib
        results.append(r)
        print(f"N={n:>6} backend={a.backend:<8} chunk={a.chunk:<5} peak +{r['peak_mib']:8.1f} MiB "
              f"(one full N x N x heads score matrix: {full_mib:8.1f} MiB)  {r['seconds']:.1f} s  finite={r['finite']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
