"""Helpers shared by the CLI modules: friendly errors, list parsing, task options."""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import typer

from posbias.cli.config_file import file_out
from posbias.utils.options import parse_key_values, parse_names, parse_numbers  # noqa: F401 (re-exported for the CLI modules)

# EOFError: a truncated file read without a reader that names it (click would turn it into a bare
# "Aborted.").
USER_ERRORS = (ValueError, FileNotFoundError, KeyError, RuntimeError, OSError, EOFError)


# Parameters of the commands that name files or folders: ``~`` is expanded in them here, once, for
# every command (the shell leaves ``--out=~/runs/x`` as it is).
PATH_PARAMETERS = ("out", "model", "factors", "corpus", "heldout", "routers", "settings", "path", "data_root",
                   "include_path", "folders", "tokenizer", "haystack")
INTERRUPTED = "interrupted: re-run the same command to resume"


def expand_user_paths(kwargs: dict) -> dict:
    """``kwargs`` with a leading ``~`` of every :data:`PATH_PARAMETERS` value (or list element)
    expanded to the home folder."""
    import os

    def expand(v):
        return os.path.expanduser(v) if isinstance(v, str) and v.startswith("~") else v

    return {k: ([expand(x) for x in v] if isinstance(v, (list, tuple)) else expand(v))
            if k in PATH_PARAMETERS else v for k, v in kwargs.items()}


def friendly_errors(fn: Callable) -> Callable:
    """Every command's wrapper: ``~`` expanded in its path options (:func:`expand_user_paths`); user
    errors as one red line and exit code 2 instead of a traceback (set POSBIAS_DEBUG=1 to see the
    traceback); Ctrl-C as one line saying how to resume, exit code 130; a command that ends well says
    where its outputs are (``outputs: /abs/path``, its last line; the ``out`` of a ``--config`` file
    without ``--out``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import os

        try:
            kwargs = expand_user_paths(kwargs)
            result = fn(*args, **kwargs)
            announce_outputs(kwargs.get("out") or file_out(kwargs.get("config")))  # --out, else --config's
            return result
        except KeyboardInterrupt:
            if os.environ.get("POSBIAS_DEBUG"):
                raise
            typer.secho(INTERRUPTED, fg="yellow", err=True)
            sys.exit(130)
        except USER_ERRORS as e:
            if os.environ.get("POSBIAS_DEBUG"):
                raise
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            if isinstance(e, EOFError):
                msg = f"unexpected end of a file ({e or 'truncated'})"
            typer.secho(f"error: {msg}", fg="red", err=True)
            sys.exit(2)

    return wrapper


def announce_outputs(out) -> None:
    """The last line of a command that wrote into ``--out``: ``outputs: <absolute folder>``."""
    from pathlib import Path

    if out and Path(str(out)).exists():
        typer.echo(f"outputs: {Path(str(out)).expanduser().resolve()}")


FACTORS_HELP = ("factors file for lpes (best_factors.json of posbias search): one RoPE factor per decoder layer, "
                "each a number from 1e-3 to 1e3")

DEPTHS_HELP = ("gold depths in [0, 1], comma-separated, or every:N (N evenly spaced: every:20 puts the gold at each "
               "of 20 documents)")

DEFAULT_MODEL = "smollm2-135m"  # the packaged model a command uses without --model


def ModelOption(default: str = DEFAULT_MODEL):
    """The ``--model`` option of every command that loads a model: a Hugging Face folder, a .gguf
    file, a Hub id or a packaged alias (``posbias.models.packaged``)."""
    return typer.Option(default, help="the model: a Hugging Face model folder, a .gguf file, a Hub id (org/name; "
                                      "--revision pins it) or an alias (smollm2-135m, qwen2.5-coder-0.5b, "
                                      "qwen2.5-coder-1.5b, gemma-3-270m)")


# How every command that loads a model places it (posbias.utils.devices; train and study take --device).
Device = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N | mps | shard (auto: the first CUDA "
                                               "GPU, else the CPU; shard: the model's layers split over every "
                                               "visible GPU, for a model one GPU cannot hold)")
Dtype = typer.Option("auto", "--dtype", help="weights and compute: auto | float32 | bfloat16 | float16 "
                                             "(auto: bfloat16 on a GPU and on a CPU with native bfloat16, "
                                             "else float32; POSBIAS_CPU_AUTO_DTYPE=float32 keeps float32 on the "
                                             "CPU)")
Revision = typer.Option(None, "--revision", help="branch, tag or commit of a Hugging Face Hub id given as --model")


def load_options(device: str, dtype: str, revision: str | None = None):
    """The :class:`posbias.models.LoadOptions` of ``--device`` / ``--dtype`` / ``--revision``, checked
    on this machine now (one line and exit code 2 before any folder is touched when it cannot be used)."""
    from posbias.models.options import LoadOptions

    options = LoadOptions(device, dtype, revision)
    options.placement()
    return options


def Count(default, *decls: str, minimum: int = 1, help: str | None = None):
    """A count option (instances, batch size, workers, steps, ...): a value below ``minimum`` is
    refused while the command line is parsed, with the option's name, before anything runs."""
    return typer.Option(default, *decls, min=minimum, help=help)


def check_training_run(cfg: Any, kind: str, settings: dict, check_keys, upgrade=None) -> bool:
    """The checks a ``train`` or ``study`` run can make before it reads any data: ``cfg.validate()``
    where there is one, a ``bpe:<N>`` tokenizer size, the corpus / held-out paths it names, and its
    run folder (``kind``). Returns whether the folder already holds this run, which re-running then
    resumes. ``upgrade``: see :func:`posbias.utils.run_folder.open_run`."""
    from pathlib import Path

    from posbias.training.tokenizer import parse_bpe_spec
    from posbias.utils.corpus import BUILTIN_CORPORA
    from posbias.utils.run_folder import open_run

    if hasattr(cfg, "validate"):
        cfg.validate()
    if getattr(cfg, "device", None) is not None:
        from posbias.utils.devices import resolve_device

        resolve_device(cfg.device)
    parse_bpe_spec(cfg.tokenizer)
    corpus = cfg.corpus if isinstance(cfg.corpus, list) else [cfg.corpus]
    for flag, paths in (("--corpus", corpus), ("--heldout", [getattr(cfg, "heldout", None)])):
        for p in paths:
            if p is not None and str(p) not in BUILTIN_CORPORA and not Path(p).expanduser().exists():
                raise ValueError(f"{flag} {p}: no such file or folder")
    return open_run(cfg.out, kind, settings, check_keys=check_keys, upgrade=upgrade).resuming


def task_options(num_keys, num_docs, length, path, haystack, num_needles, extra) -> dict[str, Any]:
    """Collect the task flags a user set (unset flags are left to the task's defaults)."""
    opts = {"num_keys": num_keys, "num_docs": num_docs, "length": length, "path": path,
            "haystack": haystack, "num_needles": num_needles}
    opts = {k: v for k, v in opts.items() if v is not None}
    opts.update(parse_key_values(extra, "opt"))
    return opts


# Reusable typer option declarations (task flags shared by eval / search / compare).
NumKeys = Count(None, "--num-keys", help="kv / kv-uuid: number of key-value pairs")
NumDocs = Count(None, "--num-docs", help="mdqa: number of documents")
Length = Count(None, "--length", help="passkey / niah: target prompt length in tokens")
DataPath = typer.Option(None, "--path", help="data file (kv-uuid / mdqa lost-in-the-middle .jsonl.gz)")
Haystack = typer.Option(None, "--haystack",
                        help="passkey / niah filler: noise | essay | needle (niah) | the path of a text corpus (.txt, "
                             ".md, .jsonl or a folder)")
NumNeedles = Count(None, "--num-needles", help="niah: number of needles (multi-key)")
Seed = Count(0, "--seed", minimum=0, help="random seed of the instances (and of the search / training)")
ExtraOpts = typer.Option(None, "--opt", help="other task option as key=value (repeatable)")
AttentionOption = typer.Option(False, "--attention/--no-attention",
                               help="also record where the last prompt position's attention went: the gold record's "
                                    "attention mass and rank among the records and the retrieval-head hit rate, per "
                                    "layer (kv, kv-uuid, mdqa; attention.png beside the accuracy plot)")


def ready_methods(names: list[str], routers: str | None) -> list[str]:
    """``names`` less the methods that are not ready to score: MoICE without trained routers (neither
    ``--routers`` nor a ``moice@routers=...`` variant) would run untrained ones; each is skipped with
    one line saying how to train them."""
    from posbias.methods.registry import split_variant

    kept = []
    for label in names:
        name, opts = split_variant(label)
        if name == "moice" and not routers and "routers" not in opts:
            typer.secho(f"{label} skipped: MoICE needs routers trained for this model (posbias train-moice "
                        "--model MODEL --out ROUTERS, then --routers ROUTERS)", fg="yellow", err=True)
            continue
        kept.append(label)
    return kept


def method_options_from_flags(names: list[str], *, factors: str | None, pi_factor: float | None,
                              routers: str | None, settings: str | None, recorded: dict | None = None) -> dict:
    """Per-method options from the shared flags of ``compare`` / ``ability`` (``--factors`` for lpes,
    ``--pi-factor``, ``--routers`` for moice, ``--settings`` from ``posbias tune``), keyed by method
    name; :func:`posbias.methods.registry.variant_options` adds a variant's own options. ``recorded``:
    options from a ``--config`` file, which the given flags override (``pi_factor`` None: not given)."""
    from posbias.methods.registry import split_variant

    variants = [split_variant(label) for label in names]  # a variant name@key=value counts as its method
    bases = {name for name, _ in variants}
    options: dict = {name: dict(opts) for name, opts in (recorded or {}).items()}
    if pi_factor is not None or "pi" not in options:
        options["pi"] = {**options.get("pi", {}), "factor": 1.1 if pi_factor is None else pi_factor}
    pi_factor = options["pi"].get("factor")
    factors = factors or options.get("lpes", {}).get("factors")
    if "lpes" in bases:
        if not factors and any(name == "lpes" and "factors" not in opts for name, opts in variants):
            raise ValueError("--methods includes lpes: give its factors file with --factors (from posbias search)")
        if factors:
            options["lpes"] = {**options.get("lpes", {}), "factors": factors}
    elif factors and "lpes" not in options:
        raise ValueError("--factors is only used by lpes, which --methods does not list")
    if "pi" in bases and not (isinstance(pi_factor, (int, float)) and pi_factor > 0):
        raise ValueError(f"--pi-factor must be > 0, got {pi_factor}")
    if routers:
        if "moice" not in bases:
            raise ValueError("--routers is only used by moice, which --methods does not list")
        options["moice"] = {"routers": routers}
    if settings:
        from posbias.search.tune import read_settings

        for name, opts in read_settings(settings).items():
            options[name] = {**options.get(name, {}), **opts}
    return options

