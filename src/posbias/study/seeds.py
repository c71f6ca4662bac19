"""Several study folders side by side, one row per scheme and folder: do a study's figures survive a
re-train with another seed? (Issue #16: "at least two training seeds ... with both results shown".)

Each folder keeps its own instances and models; this module only reads their jsonl results. Rows are
labelled by the folder's seed (``ggd (seed 1)``), or by the folder name where two folders share a
seed. Settings that differ between the folders besides the seed are listed in the header, and so
are the trained models' own saved settings where they differ (a changed code default), so a
comparison of unequal protocols (another step cap, another initialisation) says so; folders trained at different
context lengths are refused (their multipliers would not line up).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from posbias.bam import BamConfig
from posbias.evaluation.long_context import accuracy_by_length, instances_by_length
from posbias.study.config import CHECK_KEYS, MODELS_FILE, needle_draw_of
from posbias.study.grid import VIEW_FILES
from posbias.study.plots import plot_accuracy_vs_length, plot_probe_curves
from posbias.study.report import accuracy_table, length_table, probe_history, trainer_logs, training_table
from posbias.utils.io import atomic_write_text, read_json, read_jsonl
from posbias.utils.run_folder import CONFIG, folder_kind, settings_diff


@dataclass
class Study:
    """One study folder: its path, settings (``config.json``) and the label of its rows."""

    path: Path
    config: dict
    label: str = ""
    only: tuple[str, ...] = ()  # the schemes to compare; empty = all

    @property
    def models(self) -> dict[str, str]:
        """``{scheme: model folder relative to the study}`` (``models.json``; empty before any training),
        restricted to ``only`` when it is set."""
        models = read_json(self.path / MODELS_FILE) if (self.path / MODELS_FILE).exists() else {}
        return {m: d for m, d in models.items() if self.keeps(m)}

    def keeps(self, scheme: str | None) -> bool:
        """Whether rows of ``scheme`` belong in the comparison (every scheme when ``only`` is empty)."""
        return not self.only or scheme in self.only

    @property
    def schemes(self) -> list[str]:
        return list(self.models)


def load_study(folder: str | Path) -> Study:
    """One study folder; raises ``ValueError`` when ``folder`` is not a study."""
    path = Path(folder).expanduser()
    if not path.is_dir() or folder_kind(path) != "study":
        raise ValueError(f"{path} is not a study folder (no config.json of a posbias study)")
    config = read_json(path / CONFIG).get("config", {})
    # settings recorded only by later versions get their defaults, so a difference from them shows
    return Study(path, {"model_options": {}, **config, "needle_draw": needle_draw_of(config)})


def load_studies(folders: Sequence[str | Path], schemes: Sequence[str] = ()) -> list[Study]:
    """Read and check the folders (at least two, one training context); rows get their labels.
    ``schemes`` keeps only those schemes (each must be in at least one folder)."""
    if len(folders) < 2:
        raise ValueError("give at least two study folders to compare")
    studies = [load_study(f) for f in folders]
    if schemes:
        found = {m for s in studies for m in s.schemes}
        missing = [m for m in schemes if m not in found]
        if missing:
            raise ValueError(f"--schemes {','.join(missing)}: in none of the folders "
                             f"(they hold {','.join(sorted(found))})")
        for s in studies:
            s.only = tuple(schemes)
    contexts = {s.config.get("train_context") for s in studies}
    if len(contexts) > 1:
        raise ValueError(f"the studies were trained at different contexts ({sorted(contexts)}): their lengths "
                         "do not line up")
    seeds = [s.config.get("seed") for s in studies]
    for s in studies:
        s.label = f"seed {s.config.get('seed')}" if seeds.count(s.config.get("seed")) == 1 else s.path.name
    return studies


def _differences(studies: list[Study]) -> list[str]:
    keys = [k for k in CHECK_KEYS if k != "seed"]
    first = studies[0]
    return [f"{s.label} vs {first.label}: {d}"
            for s in studies[1:] for d in settings_diff(first.config, s.config, keys)] + _model_differences(studies)


# how a saved model runs, not what was trained (a later version may change them without retraining)
RUNTIME_FIELDS = ("attn_backend", "attn_chunk_size", "ffn_chunk_size", "use_cache")


def _model_differences(studies: list[Study]) -> list[str]:
    """Per scheme, the trained models' own settings that differ between folders (their saved
    ``BamConfig``, a field missing from an older save taken at its default): what a code default
    changed between runs, which no study setting records (the sinusoidal embedding init changed on 2026-12-04,
    say). Fields a study's ``--model-opt`` sets are listed with the study settings instead."""
    out = []
    for scheme in _schemes(studies):
        runs = [(s, cfg) for s in studies if (cfg := _model_config(s, scheme)) is not None]
        if len(runs) < 2:
            continue
        first, base = runs[0]
        for s, cfg in runs[1:]:
            shown = set(first.config.get("model_options", {})) | set(s.config.get("model_options", {}))
            keys = [k for k in base if k not in shown]
            out += [f"{s.label} vs {first.label}: {scheme} model {d}" for d in settings_diff(base, cfg, keys)]
    return out


def _model_config(study: Study, scheme: str) -> dict | None:
    """The saved ``BamConfig`` fields of ``scheme``'s model in ``study`` (defaults for fields an older
    version did not save; runtime fields left out); None when it has no saved model."""

    models = study.models
    path = study.path / models.get(scheme, "") / "config.json"
    if scheme not in models or not path.is_file():
        return None
    saved = read_json(path)
    return {k: saved.get(k, default) for k, default in BamConfig.defaults().items() if k not in RUNTIME_FIELDS}


def _schemes(studies: list[Study]) -> list[str]:
    order: list[str] = []
    for s in studies:
        order += [m for m in s.schemes if m not in order]
    return order


def compare_studies(folders: Sequence[str | Path], out: str | Path, *, mode: str = "tf",
                    schemes: Sequence[str] = ()) -> str:
    """Write ``out`` (markdown: an overview with every view in one table, the folders' accuracies
    ``/``-separated in each cell; training per folder; then per view one accuracy table with a row per
    scheme and folder, 95% Wilson intervals) and one accuracy-vs-length PNG per view beside it
    (``<stem>_<view>.png``), plus ``<stem>_probes.png`` with every run's 1x probes against the
    training step when the trainers probed; ``schemes`` limits every table to those schemes; returns
    the markdown."""
    studies = load_studies(folders, schemes)
    out = Path(out)
    order, context = _schemes(studies), int(studies[0].config.get("train_context"))
    views, per_view = _view_sections(studies, order, out, mode, context)
    overview = [_overview(studies, order, per_view, context)] if per_view else []
    text = "\n".join([_header(studies)] + overview + _training_sections(studies, out) + views)
    atomic_write_text(out, text)
    return text


def _training_sections(studies: list[Study], out: Path) -> list[str]:
    """A training table per folder, then ``<stem>_probes.png`` (every run's 1x probes against the
    step) when the trainers probed."""

    sections, probes = [], {}
    for s in studies:
        logs = trainer_logs(s.path, s.schemes)
        table = training_table(s.path, logs)
        if table:
            sections.append(table.replace("## Training", f"## Training, {s.label}", 1))
        probes.update({f"{m} ({s.label})": h for m, h in probe_history(logs).items()})
    if probes:
        plot = plot_probe_curves(probes, out.with_name(f"{out.stem}_probes.png"),
                                 title="probes at the training length, one line per scheme and seed",
                                 target=studies[0].config.get("train_options", {}).get("probe_target"))
        sections.append(f"![probes during training]({plot.name})\n")
    return sections


def _view_sections(studies: list[Study], schemes: list[str], out: Path, mode: str,
                   context: int) -> tuple[list[str], dict[str, dict]]:
    """Per view: one accuracy table (a row per scheme and folder, Wilson intervals) and
    ``<stem>_<view>.png``; also returns ``{view: {"scheme (label)": {length: accuracy}}}``."""

    sections, per_view = [], {}
    for view, _task, fname in VIEW_FILES:
        curves, sizes = {}, {}
        for s in studies:
            recs = [r for r in read_jsonl(s.path / fname) if s.keeps(r.get("model"))]
            curves.update({f"{m} ({s.label})": by for m, by in accuracy_by_length(recs, mode=mode).items()})
            sizes.update({f"{m} ({s.label})": by for m, by in instances_by_length(recs, mode=mode).items()})
        if not curves:
            continue
        per_view[view] = curves
        rows = [f"{m} ({s.label})" for m in schemes for s in studies if f"{m} ({s.label})" in curves]
        lengths = sorted({L for by in curves.values() for L in by})
        sections.append(accuracy_table(f"{view}, accuracy (%), mean over depths [95% Wilson interval]",
                                        curves, rows, lengths, context, sizes))
        plot = plot_accuracy_vs_length(curves, out.with_name(f"{out.stem}_{view}.png"),
                                       title=f"{view} accuracy, one line per scheme and seed", train_context=context)
        sections.append(f"![{view}]({plot.name})\n")
    return sections, per_view


def _overview(studies: list[Study], schemes: list[str], per_view: dict[str, dict], context: int) -> str:
    """Every view in one table: a row per view and scheme, a cell per length holding the accuracy (%)
    of each folder that has the scheme, ``/``-separated in folder order (``·`` = not scored there)."""
    lengths = sorted({L for curves in per_view.values() for by in curves.values() for L in by})
    rows = []
    for view, curves in per_view.items():
        for m in schemes:
            runs = [s for s in studies if f"{m} ({s.label})" in curves]
            if not runs:
                continue
            cells = ["/".join(_percent(curves[f"{m} ({s.label})"].get(L)) for s in runs) for L in lengths]
            rows.append((f"{view}: {m} ({'/'.join(s.label.replace('seed ', 's') for s in runs)})", cells))
    title = "Overview: accuracy (%) per folder, in the order given (intervals in the tables below)"
    return length_table(title, lengths, context, rows)


def _percent(acc: float | None) -> str:
    return "·" if acc is None else f"{100 * acc:.0f}"


def _header(studies: list[Study]) -> str:
    folders = ", ".join(f"`{s.path}` ({s.label})" for s in studies)
    text = f"# Study across seeds\n\nFolders: {folders}.\n"
    diffs = _differences(studies)
    text += ("\nSettings that differ besides the seed: " + "; ".join(diffs) + ".\n") if diffs else \
        "\nThe folders differ only in the seed (training data order, initialisation and evaluation instances).\n"
    return text
