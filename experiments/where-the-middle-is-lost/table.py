"""Tables and figure of docs/results/where-the-middle-is-lost from the run folders of run.sh.

For every model and test bed (``<runs>/<model>/<bed>/``, a ``posbias eval`` folder): accuracy by depth with 95%
Wilson intervals (teacher-forced; for multi-document QA also the reference's score, best_subspan_em of the greedy
answer, and how often the two agree), the middle third (depths 0.25-0.75 pooled) against the better end, whether
that is a real U (middle third at least 20 points below the better end, the two intervals apart), the gold record's
attention by depth, prompt tokens, wall time and commit. Also the float32 / bfloat16 agreement of the beds run in
both, the held-out and search ids of the beds with a U, and the word-KV maps by length.

    python experiments/where-the-middle-is-lost/table.py --runs runs/where-the-middle-is-lost \
        --out docs/results/where-the-middle-is-lost
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from posbias.evaluation.stats import newcombe_paired, wilson_interval
from posbias.utils.figures import pyplot, save_figure
from posbias.utils.io import atomic_write_json, atomic_write_text, read_jsonl

MIDDLE = (0.25, 0.5, 0.75)
U_POINTS = 0.20  # the middle third at least this far below the better end
OTHER_END = 0.10  # and, for a U rather than primacy (or recency) alone, the other end this far above the middle
BEDS = ("kv340", "mdqa10-nq", "mdqa10-hotpot", "mdqa20-nq", "mdqa20-hotpot", "mdqa30-nq", "mdqa30-hotpot", "kvuuid75")
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m", "smollm2-135m")


def bed_folders(runs: Path) -> list[tuple[str, str, Path]]:
    """``(model, bed, folder)`` of every finished eval folder (a summary.json), bfloat16 beds only."""
    out = []
    for model in MODELS:
        for folder in sorted((runs / model).glob("*")):
            if (folder / "summary.json").is_file() and folder.name in BEDS:
                out.append((model, folder.name, folder))
    return out


def key_of(record: dict, metric: str) -> float:
    """A record's right / wrong under ``metric``: teacher-forced ``tf`` or the reference's ``generate``."""
    return float(record["tf_em"]) if metric == "tf" else float(record["gen_score"] >= 1.0)


def depth_rows(records: list[dict], metric: str) -> list[dict]:
    rows = []
    for depth in sorted({float(r["depth"]) for r in records}):
        vals = [key_of(r, metric) for r in records if float(r["depth"]) == depth]
        lo, hi = wilson_interval(sum(vals), len(vals))
        rows.append({"depth": depth, "n": len(vals), "accuracy": sum(vals) / len(vals), "ci": [lo, hi]})
    return rows


def u_test(records: list[dict], metric: str) -> dict:
    """The middle third (depths 0.25-0.75 pooled) against the better end (depth 0 or 1)."""
    rows = {r["depth"]: r for r in depth_rows(records, metric)}
    middle = [key_of(r, metric) for r in records if float(r["depth"]) in MIDDLE]
    if not middle or 0.0 not in rows or 1.0 not in rows:
        return {}
    m = sum(middle) / len(middle)
    m_ci = wilson_interval(sum(middle), len(middle))
    end, other = sorted((rows[0.0], rows[1.0]), key=lambda r: -r["accuracy"])
    gap = end["accuracy"] - m
    lost = bool(gap >= U_POINTS and m_ci[1] < end["ci"][0])
    shape = "U" if other["accuracy"] - m >= OTHER_END else ("primacy" if end["depth"] == 0.0 else "recency")
    return {"middle": m, "middle_ci": list(m_ci), "middle_n": len(middle), "better_end": end["depth"],
            "end": end["accuracy"], "end_ci": end["ci"], "other_end": other["accuracy"], "gap": gap,
            "middle_lost": lost, "shape": shape if lost else "-", "real_u": lost and shape == "U"}


def attention_row(records: list[dict]) -> list[dict]:
    rows = []
    for depth in sorted({float(r["depth"]) for r in records if "attn_gold_rank" in r}):
        rs = [r for r in records if float(r["depth"]) == depth and "attn_gold_rank" in r]
        rows.append({"depth": depth, "top1": sum(r["attn_gold_rank"] == 1 for r in rs) / len(rs),
                     "median_rank": statistics.median(r["attn_gold_rank"] for r in rs),
                     "hit_rate": statistics.fmean(r["attn_hit_rate"] for r in rs)})
    return rows


def commits(folder: Path) -> str:
    """The commits of the invocations that wrote the folder (``invocations.jsonl``), shortened, in order."""
    seen: list[str] = []
    for inv in read_jsonl(folder / "invocations.jsonl"):
        c = str(inv.get("git", "?"))
        short = c[:7] + ("+dirty" if c.endswith("+dirty") else "")
        if short not in seen:
            seen.append(short)
    return ", ".join(seen)


def bed_summary(model: str, bed: str, folder: Path) -> dict:
    records = read_jsonl(folder / "results.jsonl")
    config = json.loads((folder / "config.json").read_text())
    generated = all("gen_score" in r for r in records)
    metric = "generate" if bed.startswith("mdqa") and generated else "tf"
    out = {"model": model, "bed": bed, "n": len(records), "metric": metric,
           "prompt_tokens": statistics.median(r["prompt_tokens"] for r in records if "prompt_tokens" in r),
           "dtype": config["config"].get("dtype"), "commit": commits(folder),
           "seconds": round(sum(r.get("seconds", 0.0) for r in records)),
           "tf": depth_rows(records, "tf"), "u": u_test(records, metric), "attention": attention_row(records)}
    if generated:
        out["generate"] = depth_rows(records, "generate")
        out["agreement"] = sum(key_of(r, "tf") == key_of(r, "generate") for r in records) / len(records)
    return out


def pct(x: float) -> str:
    return f"{100 * x:.0f}"


def bed_table(beds: list[dict]) -> str:
    lines = ["| model | test bed | tokens | accuracy by depth 0 / .25 / .5 / .75 / 1 (%) | middle third vs better end "
             "| middle lost: shape | gold most attended by depth (%) |", "|---|---|---:|---|---|:---:|---|"]
    for b in beds:
        rows = b["generate"] if b["metric"] == "generate" else b["tf"]
        acc = " / ".join(pct(r["accuracy"]) for r in rows)
        u = b["u"]
        gap = (f"{pct(u['middle'])} [{pct(u['middle_ci'][0])}, {pct(u['middle_ci'][1])}] vs {pct(u['end'])} "
               f"[{pct(u['end_ci'][0])}, {pct(u['end_ci'][1])}] (depth {u['better_end']:g}): {-100 * u['gap']:+.0f}"
               if u else "-")
        att = " / ".join(pct(r["top1"]) for r in b["attention"]) or "-"
        metric = " (greedy, best_subspan_em)" if b["metric"] == "generate" else ""
        verdict = ("**yes: a U**" if u.get("real_u") else f"yes: {u['shape']} only") if u.get("middle_lost") else "no"
        lines.append(f"| {b['model']} | {b['bed']}{metric} | {b['prompt_tokens']:.0f} | {acc} | {gap} | "
                     f"{verdict} | {att} |")
    return "\n".join(lines)


def scoring_table(beds: list[dict]) -> str:
    lines = ["| model | test bed | teacher-forced (shortest alias) by depth (%) | greedy best_subspan_em by depth "
             "(%) | agreement |", "|---|---|---|---|---:|"]
    for b in beds:
        if "generate" in b:
            lines.append(f"| {b['model']} | {b['bed']} | {' / '.join(pct(r['accuracy']) for r in b['tf'])} | "
                         f"{' / '.join(pct(r['accuracy']) for r in b['generate'])} | {pct(b['agreement'])}% |")
    return "\n".join(lines)


def setup_table(beds: list[dict]) -> str:
    lines = ["| model | test bed | n | dtype | wall time (s, 1 thread) | commit |", "|---|---|---:|---|---:|---|"]
    for b in beds:
        lines.append(f"| {b['model']} | {b['bed']} | {b['n']} | {b['dtype']} | {b['seconds']} | {b['commit']} |")
    return "\n".join(lines)


def dtype_agreement(runs: Path) -> list[dict]:
    """Beds run in both float32 and bfloat16: the same instances, verdicts and log-probs paired."""
    out = []
    for model in MODELS:
        for f32 in sorted((runs / model).glob("*-float32")):
            bf16 = f32.with_name(f32.name.removesuffix("-float32"))
            if not (f32 / "summary.json").is_file() or not (bf16 / "results.jsonl").is_file():
                continue
            a = {r["id"]: r for r in read_jsonl(f32 / "results.jsonl")}
            b = {r["id"]: r for r in read_jsonl(bf16 / "results.jsonl")}
            ids = [i for i in a if i in b]
            fa, fb = [float(a[i]["tf_em"]) for i in ids], [float(b[i]["tf_em"]) for i in ids]
            lp = [abs(a[i]["tf_logprob"] - b[i]["tf_logprob"]) / a[i]["n_tokens"] for i in ids]
            secs = [sum(x[i].get("seconds", 0) for i in ids) for x in (a, b)]
            row = {"model": model, "bed": bf16.name, "n": len(ids), "same_verdict": sum(x == y for x, y in zip(fa, fb)),
                   "float32": sum(fa) / len(ids), "bfloat16": sum(fb) / len(ids),
                   "diff_ci": list(newcombe_paired(fa, fb)), "logprob_median": statistics.median(lp),
                   "logprob_max": max(lp), "seconds": secs}
            if all("gen_score" in a[i] and "gen_score" in b[i] for i in ids):
                row["same_generation"] = sum(a[i]["prediction"] == b[i]["prediction"] for i in ids)
            out.append(row)
    return out


def dtype_table(rows: list[dict]) -> str:
    lines = ["| model | test bed | n | same verdict | accuracy float32 / bfloat16 | paired difference [95%] | "
             "abs. gold log-prob difference per token, median / max | same greedy text | wall time fp32 / bf16 (s) |",
             "|---|---|---:|---:|---|---|---|---:|---|"]
    for r in rows:
        gen = f"{r['same_generation']}/{r['n']}" if "same_generation" in r else "-"
        diff = (f"{100 * (r['bfloat16'] - r['float32']):+.0f} [{100 * r['diff_ci'][0]:+.0f}, "
                f"{100 * r['diff_ci'][1]:+.0f}]")
        lines.append(f"| {r['model']} | {r['bed']} | {r['n']} | {r['same_verdict']}/{r['n']} | {pct(r['float32'])} / "
                     f"{pct(r['bfloat16'])} | {diff} | {r['logprob_median']:.3f} / {r['logprob_max']:.3f} | {gen} | "
                     f"{r['seconds'][0]:.0f} / {r['seconds'][1]:.0f} |")
    return "\n".join(lines)


def map_rows(runs: Path) -> list[dict]:
    out = []
    for model in MODELS:
        s = runs / model / "map-kv" / "summary.json"
        if s.is_file():
            summary = json.loads(s.read_text())
            out.append({"model": model, "cells": summary["cells"], "lengths": summary["lengths"],
                        "depths": summary["depths"], "failures": summary.get("failures", {}),
                        "attention": summary.get("attention", {})})
    return out


def map_table(maps: list[dict]) -> str:
    lines = []
    for m in maps:
        lines += [f"**{m['model']}** (word KV, n = 30 contexts per length, accuracy % by depth; gold most attended %)",
                  "", "| length (tokens) | " + " | ".join(f"{d:g}" for d in m["depths"]) + " |",
                  "|---|" + "---:|" * len(m["depths"])]
        att = m["attention"].get("none", {}).get("by_length", {})
        for x in m["lengths"]:
            cells = {round(c["depth"], 6): c for c in m["cells"]
                     if c["method"] == "none" and c["length"] == x["tokens"]}
            tops = {round(r["depth"], 6): r["top1"] for r in att.get(str(x["tokens"]), [])}
            row = [f"{pct(cells[round(d, 6)]['accuracy'])}" + (f" ({pct(tops[round(d, 6)])})" if round(d, 6) in tops
                                                                 else "") if round(d, 6) in cells else "-"
                   for d in m["depths"]]
            lines.append(f"| {x['tokens']} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def closing_table(runs: Path) -> str:
    """Qwen2.5-Coder-1.5B's drop at depth 1: the same contexts and questions with and without a closing line
    after the records (``kv169-closing`` against the 2,048-token cells of ``map-kv``), paired."""
    model = "qwen2.5-coder-1.5b"
    closed, grid = runs / model / "kv169-closing" / "results.jsonl", runs / model / "map-kv" / "results.jsonl"
    if not closed.is_file() or not grid.is_file():
        return "(not run)"
    with_line = {r["id"]: r for r in read_jsonl(closed)}
    plain = {r["id"]: r for r in read_jsonl(grid) if r["length"] == 2048 and r["method"] == "none"}
    lines = ["| depth | n | without / with the line (%) | paired difference [95%] | wrong answers without the "
             "line: class (offset) |", "|---:|---:|---|---|---|"]
    for depth in sorted({r["depth"] for r in with_line.values()}):
        ids = [i for i, r in with_line.items() if r["depth"] == depth and i in plain]
        a, b = [float(plain[i]["correct"]) for i in ids], [float(with_line[i]["tf_em"]) for i in ids]
        lo, hi = newcombe_paired(a, b)
        wrong = ", ".join(f"{plain[i].get('failure')} ({plain[i].get('offset', '-')})" for i, x in zip(ids, a) if not x)
        lines.append(f"| {depth:g} | {len(ids)} | {pct(sum(a) / len(a))} / {pct(sum(b) / len(b))} | "
                     f"{100 * (sum(b) - sum(a)) / len(ids):+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}] | {wrong or '-'} |")
    return "\n".join(lines)


def heldout_ids(beds: list[dict], runs: Path) -> dict:
    """The instance ids of the beds where the middle is lost: held out (the folder's) and the search split's
    recipe."""
    out = {}
    for b in beds:
        if b["u"].get("middle_lost"):
            folder = runs / b["model"] / b["bed"]
            cfg = json.loads((folder / "config.json").read_text())["config"]
            ids = sorted(r["id"] for r in read_jsonl(folder / "results.jsonl"))
            heldout = {"split": "eval", "seed": cfg["seed"], "n": cfg["n"], "ids": ids}
            out[f"{b['model']}/{b['bed']}"] = {"shape": b["u"]["shape"], "task": cfg["task"],
                                               "task_options": cfg["task_options"],
                                               "depths": cfg["depths"], "heldout": heldout,
                                               "search": {"split": "search", "seed": cfg["seed"]}}
    return out


def plot(beds: list[dict], path: Path) -> None:
    plt = pyplot()
    models = [m for m in MODELS if any(b["model"] == m for b in beds)]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        for b in (b for b in beds if b["model"] == model):
            rows = b["generate"] if b["metric"] == "generate" else b["tf"]
            style = "-" if b["u"].get("real_u") else ":"
            ax.plot([r["depth"] for r in rows], [100 * r["accuracy"] for r in rows], style, marker="o", label=b["bed"])
        ax.set_title(model, fontsize=10)
        ax.set_xlabel("relative depth of the gold item")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("accuracy (%) (solid: a real U)")
    fig.suptitle("Test beds, held out, n = 30 per depth (multi-document QA: greedy best_subspan_em)")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs/where-the-middle-is-lost")
    ap.add_argument("--out", default="docs/results/where-the-middle-is-lost")
    args = ap.parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    beds = [bed_summary(*x) for x in bed_folders(runs)]
    dtypes, maps = dtype_agreement(runs), map_rows(runs)
    atomic_write_json(out / "test_beds.json", {"beds": beds, "dtype": dtypes})
    atomic_write_json(out / "heldout_ids.json", heldout_ids(beds, runs))
    text = ["## Test beds", "", bed_table(beds), "",
            "## Multi-document QA: teacher forcing and the reference's score", "", scoring_table(beds), "",
            "## float32 and bfloat16 on the same instances", "", dtype_table(dtypes), "",
            "## Word KV by prompt length", "", map_table(maps), "## A closing line after the records", "",
            closing_table(runs), "", "## Setup", "", setup_table(beds)]
    atomic_write_text(out / "tables.md", "\n".join(text) + "\n")
    if beds:
        plot(beds, out / "test_beds.png")
    print((out / "tables.md").read_text())


if __name__ == "__main__":
    main()
