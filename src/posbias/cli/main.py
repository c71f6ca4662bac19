"""The ``posbias`` command. Each subcommand lives in its own module under ``posbias.cli``
and exposes ``register(app)``; this file only assembles them."""
from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import typer
from typer.core import TyperGroup


class OneLineErrors(TyperGroup):
    """Command-line errors (an option out of range, missing or unknown) as one line and exit code 2,
    like every other bad input, instead of a usage block and a boxed message."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        line_buffered_stdout()
        warnings.formatwarning = one_line_warning
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        except typer.TyperException as e:  # typer's click errors: a bad, missing or unknown option or command
            if type(e).__name__ == "NoArgsIsHelpError":  # plain `posbias`: the help
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" ({ctx.command_path} --help lists the options)" if ctx is not None else ""
            typer.secho(f"error: {e.format_message()}{hint}", fg="red", err=True)
            sys.exit(getattr(e, "exit_code", 2))
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)  # --help: Exit(0)


def line_buffered_stdout() -> None:
    """Flush stdout at every line, also when it is a file or a pipe (``nohup posbias search ... > log``):
    the per-setting and per-generation lines of a long run then reach the log as they are printed,
    not in 8 KB blocks at the end."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


PACKAGE = Path(__file__).resolve().parents[1]
_python_warning_format = warnings.formatwarning


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """posbias's own warnings as one ``warning: ...`` line (no file, line number or source line);
    those of other libraries as Python writes them."""
    if Path(filename).resolve().is_relative_to(PACKAGE):
        return f"warning: {message}\n"
    return _python_warning_format(message, category, filename, lineno, line)


app = typer.Typer(
    cls=OneLineErrors,
    help="posbias: measure position bias in long-context transformers, fix it without retraining "
    "(LPES and baselines), and train models with positional priors (BAM).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def global_options(
    threads: int = typer.Option(None, "--threads", min=1, help="torch CPU threads for this command and its "
                                "workers in all (default: one per core); fewer keeps clear of other jobs"),
) -> None:
    """Options for every subcommand (given before it: ``posbias --threads 1 study ...``)."""
    from posbias.utils.threads import apply_threads

    hint = apply_threads(threads)
    if hint and not {"--help", "-h"} & set(sys.argv[1:]):  # help runs nothing: no note about busy cores
        typer.secho(hint, fg="yellow", err=True)


# One module per subcommand group; each defines register(app).
SUBCOMMAND_MODULES = [
    "posbias.cli.eval_cmd",
    "posbias.cli.lpes_cmd",
    "posbias.cli.demo_cmd",
    "posbias.cli.study_cmd",
    "posbias.cli.methods_cmd",
    "posbias.cli.train_cmd",
    "posbias.cli.ability_cmd",
    "posbias.cli.positional_cmd",
    "posbias.cli.map_cmd",
]

for _name in SUBCOMMAND_MODULES:
    importlib.import_module(_name).register(app)


if __name__ == "__main__":
    app()
