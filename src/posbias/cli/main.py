"""The ``posbias`` command. Each subcommand lives in its own module under ``posbias.cli``
and exposes ``register(app)``; this file only assembles them."""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    help="posbias: measure position bias in long-context transformers, fix it without retraining "
    "(LPES and baselines), and train models with positional priors (BAM).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# One module per subcommand group; each defines register(app).
SUBCOMMAND_MODULES = [
    "posbias.cli.eval_cmd",
    "posbias.cli.lpes_cmd",
    "posbias.cli.demo_cmd",
    "posbias.cli.study_cmd",
    "posbias.cli.methods_cmd",
    "posbias.cli.train_cmd",
]

for _name in SUBCOMMAND_MODULES:
    importlib.import_module(_name).register(app)


if __name__ == "__main__":
    app()
