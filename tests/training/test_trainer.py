import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from posbias.training import PackedDataset, TrainConfig, load_texts, lr_lambda, train
from posbias.training.trainer import load_checkpoint, make_optimizer, run_label

SENTENCES = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
             "There and back again.", "The pass key is 12345.", "Remember it.", "Question: who wrote the document?"]
TINY_MODEL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64)


def _write_corpus(folder: Path, n_docs: int = 12, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(n_docs // 2):
        (folder / f"doc{d}.txt").write_text(" ".join(rng.choice(SENTENCES, 30)))
    with open(folder / "more.jsonl", "w") as f:
        for _ in range(n_docs - n_docs // 2):
            f.write(json.dumps({"text": " ".join(rng.choice(SENTENCES, 30))}) + "\n")
    return folder


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(out=str(tmp_path / "run"), steps=6, context=32, batch_size=2, model_overrides=dict(TINY_MODEL),
                warmup_steps=2, log_every=2, checkpoint_every=3, corpus=[str(tmp_path / "corpus")], progress=False,
                pe="ggd", ssmax=True)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture()
def corpus(tmp_path):
    return _write_corpus(tmp_path / "corpus")


def test_load_texts_files_folders_and_errors(tmp_path, corpus):
    texts = load_texts([corpus])
    assert len(texts) == 12
    assert len(load_texts(corpus / "more.jsonl")) == 6
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty corpus"):
        load_texts([tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match="corpus path not found"):
        load_texts([tmp_path / "nope"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_texts([bad])


def test_builtin_paul_graham_corpus():
    texts = load_texts("paul-graham")
    assert len(texts) > 20 and sum(len(t) for t in texts) > 100_000


def test_packing_doc_ids_and_determinism(tiny_tokenizer, corpus):
    texts = load_texts([corpus])
    ds = PackedDataset(texts, tiny_tokenizer, 32, seed=1)
    ids, docs = ds.block(0)
    assert ids.shape == docs.shape == (32,)
    # every document ends with EOS, and the doc id changes right after an EOS
    eos = tiny_tokenizer.eos_token_id
    change = (ds.doc_ids[1:] != ds.doc_ids[:-1]).nonzero()[0]
    assert (ds.tokens[change] == eos).all()
    again = PackedDataset(texts, tiny_tokenizer, 32, seed=1)
    for k in (0, 5, len(ds) + 3):
        assert torch.equal(ds.block(k)[0], again.block(k)[0])
    epoch0 = torch.stack([ds.block(k)[0] for k in range(len(ds))])
    epoch1 = torch.stack([ds.block(len(ds) + k)[0] for k in range(len(ds))])
    assert not torch.equal(epoch0, epoch1) and torch.equal(epoch0.sort(0).values, epoch0.sort(0).values)
    with pytest.raises(ValueError, match="context length must be positive"):
        PackedDataset(texts, tiny_tokenizer, 0)
    with pytest.raises(ValueError, match="corpus too small"):
        PackedDataset(["hi"], tiny_tokenizer, 32)


def test_passkey_mixing(tiny_tokenizer, corpus):
    from posbias.evaluation.batching import prompt_text
    from posbias.tasks import make_instances

    ds = PackedDataset(load_texts([corpus]), tiny_tokenizer, 320, passkey_rate=0.5)
    eval_text = prompt_text(tiny_tokenizer, make_instances("passkey", tokenizer=tiny_tokenizer, n=1, depths=[0.5],
                                                           seed=0, split="eval", length=320)[0], False)
    n_pk = 0
    for k in range(40):
        ids, docs = ds.block(k)
        assert ids.shape == docs.shape == (320,)
        if docs[0] < 0:
            n_pk += 1
            n = int((docs == docs[0]).sum())
            assert n > 160 and len(set(docs[n:].tolist())) == 320 - n  # padding: one document per token
            assert ids[n - 1] == tiny_tokenizer.eos_token_id
            text = tiny_tokenizer.decode(ids[: n - 1])
            key = text.split("The pass key is ")[1][:5]
            assert key.isdigit() and text.endswith(f"The pass key is {key}.")
            # the same wording as the evaluation prompt, answer included
            assert text.startswith(eval_text.split("\n")[0]) and text.endswith("What is the pass key? The pass key is "
                                                                               f"{key}.")
    assert 8 <= n_pk <= 32
    with pytest.raises(ValueError, match="too short for passkey"):
        PackedDataset(load_texts([corpus]), tiny_tokenizer, 40, passkey_rate=0.5)


def test_passkey_filler_from_the_corpus(tiny_tokenizer, corpus):
    """passkey_haystack: corpus sentences instead of the noise (about as many tokens, same wording
    around them); mixed draws either; noise leaves every block as it was."""
    from posbias.tasks.haystack import NOISE, split_sentences
    from posbias.tasks.passkey import PASSKEY_INTRO

    texts = load_texts([corpus])
    sentences = {x for t in texts for x in split_sentences(t)}
    noise = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.5, seed=3)
    default = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.5, seed=3, passkey_haystack="noise")
    fillers = {}
    for haystack in ("corpus", "mixed"):
        ds = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.5, seed=3, passkey_haystack=haystack)
        kinds = []
        for k in range(40):
            ids, docs = ds.block(k)
            assert torch.equal(default.block(k)[0], noise.block(k)[0])
            if docs[0] >= 0:
                continue
            n = int((docs == docs[0]).sum())
            text = tiny_tokenizer.decode(ids[: n - 1])
            key = text.rsplit("The pass key is ", 1)[1][:5]
            assert text.startswith(PASSKEY_INTRO) and text.endswith(f"What is the pass key? The pass key is {key}.")
            hay = text.split("\n")[1].replace(f"The pass key is {key}. Remember it. {key} is the pass key.", " ")
            kinds.append("noise" if not hay.replace(NOISE, " ").strip() else "corpus")
            if kinds[-1] == "corpus":
                assert n > 100 and any(x in hay for x in sentences)
        fillers[haystack] = kinds
    assert set(fillers["corpus"]) == {"corpus"} and set(fillers["mixed"]) == {"noise", "corpus"}
    with pytest.raises(ValueError, match="passkey_haystack must be one of"):
        PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.5, passkey_haystack="essay")
    with pytest.raises(ValueError, match="passkey_haystack must be one of"):
        TrainConfig(pe="rope", passkey_haystack="essay").validate()


def test_niah_documents_in_the_training_mix(tiny_tokenizer, corpus):
    """Single-needle RULER documents beside passkey ones; niah_rate=0 leaves every block as before."""
    from posbias.tasks.niah import NIAH_INTRO

    texts = load_texts([corpus])
    mixed = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.3, niah_rate=0.3)
    plain = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.3)
    kinds = {"passkey": 0, "niah": 0, "text": 0}
    for k in range(60):
        ids, docs = mixed.block(k)
        ref_ids, _ = plain.block(k)
        if docs[0] >= 0:
            kinds["text"] += 1
            continue
        n = int((docs == docs[0]).sum())
        text = tiny_tokenizer.decode(ids[: n - 1])
        if text.startswith(NIAH_INTRO):
            kinds["niah"] += 1
            value = text.rsplit(" ", 1)[1].rstrip(".")
            assert value.isdigit() and len(value) == 7 and f"is: {value}." in text  # the needle and its answer
        else:
            kinds["passkey"] += 1
            assert torch.equal(ids, ref_ids)  # the passkey blocks are the ones niah_rate=0 gives
    assert min(kinds.values()) >= 8, kinds
    assert all(torch.equal(PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.3, niah_rate=0.0).block(k)[0],
                           plain.block(k)[0]) for k in range(10))
    with pytest.raises(ValueError, match="niah_rate"):
        PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.7, niah_rate=0.5)


def test_niah_filler_from_the_corpus(tiny_tokenizer, corpus):
    """niah_haystack: NIAH training documents filled with corpus sentences (corpus) or either filler
    (mixed), the needle and question unchanged; the passkey blocks and the noise default unchanged."""
    from posbias.tasks.haystack import NOISE, split_sentences
    from posbias.tasks.niah import NIAH_INTRO

    texts = load_texts([corpus])
    sentences = {x for t in texts for x in split_sentences(t)}
    plain = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.3, niah_rate=0.3, seed=2)
    fillers = {}
    for haystack in ("noise", "corpus", "mixed"):
        ds = PackedDataset(texts, tiny_tokenizer, 320, passkey_rate=0.3, niah_rate=0.3, seed=2, niah_haystack=haystack)
        kinds = []
        for k in range(60):
            ids, docs = ds.block(k)
            n = int((docs == docs[0]).sum())
            text = tiny_tokenizer.decode(ids[: n - 1])
            if docs[0] >= 0 or not text.startswith(NIAH_INTRO):
                assert torch.equal(ids, plain.block(k)[0])  # text and passkey blocks as before
                continue
            value = text.rsplit(" ", 1)[1].rstrip(".")
            needle = [x for x in split_sentences(text) if x.endswith(f"is: {value}.")]
            assert value.isdigit() and len(needle) == 1 and "What is the special magic number for" in text
            hay = text.split("\n")[1].replace(needle[0], " ")
            kinds.append("noise" if not hay.replace(NOISE, " ").strip() else "corpus")
            if kinds[-1] == "corpus":
                assert any(x in hay for x in sentences) and NOISE not in hay
            if haystack == "noise":
                assert torch.equal(ids, plain.block(k)[0])
        fillers[haystack] = set(kinds)
    assert fillers == {"noise": {"noise"}, "corpus": {"corpus"}, "mixed": {"noise", "corpus"}}
    with pytest.raises(ValueError, match="niah_haystack must be one of"):
        TrainConfig(pe="rope", niah_haystack="essay").validate()


def test_lr_schedule():
    f = lambda s: lr_lambda(s, steps=100, warmup=10, min_ratio=0.1)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(100) == pytest.approx(0.1)
    assert f(55) == pytest.approx(0.55)


def test_lr_schedules_constant_and_wsd():
    for steps in (100, 200):
        const = lambda s, steps=steps: lr_lambda(s, steps=steps, warmup=10, min_ratio=0.1, schedule="constant")  # noqa: E731
        assert const(0) == pytest.approx(0.1) and all(const(s) == 1.0 for s in range(10, steps + 1))
    wsd = lambda s: lr_lambda(s, steps=100, warmup=10, min_ratio=0.1, schedule="wsd", decay_fraction=0.2)  # noqa: E731
    assert wsd(0) == pytest.approx(0.1) and all(wsd(s) == 1.0 for s in range(10, 81))
    assert wsd(90) == pytest.approx(0.55) and wsd(100) == pytest.approx(0.1)
    assert [wsd(s) for s in range(81)] == [lr_lambda(s, steps=200, warmup=10, min_ratio=0.1, schedule="wsd")
                                           for s in range(81)]
    for bad, match in ((dict(schedule="linear"), "unknown schedule 'linear'"),
                       (dict(decay_fraction=0.0), "decay_fraction must be in")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(pe="rope", **bad).validate()


def _logged(run: Path) -> list[tuple]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["lr"], r["loss"]) for r in rows if "loss" in r]


@pytest.mark.parametrize("schedule, same", [("constant", True), ("cosine", False)])
def test_constant_schedule_makes_the_run_independent_of_the_cap(tmp_path, tiny_tokenizer, corpus, schedule, same):
    """The same run under a cap of 6 and of 12 steps: identical rates and losses under ``constant``
    (a stop at a probe target then means the same model whatever the cap), not under ``cosine``."""
    short, long = (tmp_path / "a", tmp_path / "b")
    train(_cfg(tmp_path, out=str(short), schedule=schedule), tokenizer=tiny_tokenizer)
    train(_cfg(tmp_path, out=str(long), steps=12, schedule=schedule), tokenizer=tiny_tokenizer)
    a, b = _logged(short), _logged(long)[:len(_logged(short))]
    assert [r[0] for r in a] == [r[0] for r in b] == [2, 4, 6]
    assert (a == b) is same


def test_no_weight_decay_on_priors_and_norms(tmp_path, tiny_tokenizer):
    from posbias.bam import build_model

    m = build_model("tiny", vocab_size=512, pe="ggd", normaliser="ssmax", **TINY_MODEL)
    opt = make_optimizer(m, _cfg(tmp_path))
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["decay"]["weight_decay"] == 0.1 and all(p.dim() == 2 for p in groups["decay"]["params"])
    assert groups["prior"]["weight_decay"] == 0.0 and len(groups["prior"]["params"]) == 2 * 2 + 2
    assert groups["no_decay"]["weight_decay"] == 0.0


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_train_outputs_and_resume_is_exact(tmp_path, tiny_tokenizer, corpus):
    from transformers import AutoModelForCausalLM

    full = train(_cfg(tmp_path, out=str(tmp_path / "full")), tokenizer=tiny_tokenizer)
    assert full == tmp_path / "full" / "final"
    run = tmp_path / "full"
    assert (run / "config.json").exists() and (run / "checkpoint.pt").exists()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [2, 4, 6]
    assert all(np.isfinite(m["loss"]) and m["tokens_per_s"] > 0 for m in metrics)
    assert "theta_beta_mean" in metrics[0] and "ssmax_s_mean" in metrics[0]
    model = AutoModelForCausalLM.from_pretrained(full)
    assert model.config.pe == "ggd" and model.config.normaliser == "ssmax"

    part = _cfg(tmp_path, out=str(tmp_path / "part"), stop_after=3)
    assert train(part, tokenizer=tiny_tokenizer) == tmp_path / "part"
    assert not (tmp_path / "part" / "final").exists()
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        train(_cfg(tmp_path, out=str(tmp_path / "part")), tokenizer=tiny_tokenizer)
    resumed = train(_cfg(tmp_path, out=str(tmp_path / "part"), resume=True), tokenizer=tiny_tokenizer)
    a, b = _weights(full), _weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(line)["step"] for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 3, 4, 6]

    # resuming with other settings is refused
    with pytest.raises(ValueError, match="other settings"):
        train(_cfg(tmp_path, out=str(tmp_path / "part"), resume=True, pe="rope"), tokenizer=tiny_tokenizer)


class _Killed(Exception):
    """Stands in for a kill at a chosen step."""


def _kill_at(step: int):
    def callback(done, model, info):
        if done == step:
            raise _Killed(done)
    return callback


def _log_lines(run: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock fields (which differ between any two runs)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in rows]


@pytest.mark.parametrize("kill_at, checkpoint_every", [(5, 6), (5, 3)],
                         ids=["before-the-first-checkpoint", "after-a-checkpoint"])
def test_a_killed_and_rerun_training_logs_exactly_what_an_uninterrupted_one_does(
        tmp_path, tiny_tokenizer, corpus, kill_at, checkpoint_every, capsys):
    """No line of a killed run survives the rerun (the fresh start of a run killed before its first
    checkpoint, the lines after the checkpoint of one killed later), and the first line after a
    resume averages the same ``log_every`` steps as the uninterrupted run (the window travels in the
    checkpoint), each line saying how many steps its loss covers."""
    kw = dict(steps=8, log_every=4, checkpoint_every=checkpoint_every)
    train(_cfg(tmp_path, out=str(tmp_path / "full"), **kw), tokenizer=tiny_tokenizer)
    full = _log_lines(tmp_path / "full")
    assert [(r["step"], r["loss_steps"]) for r in full] == [(4, 4), (8, 4)]

    with pytest.raises(_Killed):
        train(_cfg(tmp_path, **kw), tokenizer=tiny_tokenizer, callback=_kill_at(kill_at))
    run = tmp_path / "run"
    assert [r["step"] for r in _log_lines(run)] == [4]
    resume = (run / "checkpoint.pt").exists()
    assert resume == (kill_at > checkpoint_every)
    capsys.readouterr()
    train(_cfg(tmp_path, resume=resume, **kw), tokenizer=tiny_tokenizer)
    assert _log_lines(run) == full
    said = capsys.readouterr().err
    assert (f"resuming {checkpoint_every} of 8 steps already in {run}" in said) == resume, said


def test_the_line_that_stops_a_run_early_says_how_many_steps_it_averages(tmp_path, tiny_tokenizer, corpus):
    train(_cfg(tmp_path, steps=8, log_every=4, checkpoint_every=8, stop_after=3), tokenizer=tiny_tokenizer)
    train(_cfg(tmp_path, steps=8, log_every=4, checkpoint_every=8, resume=True), tokenizer=tiny_tokenizer)
    lines = _log_lines(tmp_path / "run")
    assert [(r["step"], r["loss_steps"]) for r in lines] == [(3, 3), (4, 4), (8, 4)]
    train(_cfg(tmp_path, out=str(tmp_path / "full"), steps=8, log_every=4, checkpoint_every=8),
          tokenizer=tiny_tokenizer)
    assert lines[1:] == _log_lines(tmp_path / "full")


def test_checkpoint_from_another_model_config(tmp_path, tiny_tokenizer, corpus):
    train(_cfg(tmp_path, steps=2, checkpoint_every=1, stop_after=1), tokenizer=tiny_tokenizer)
    ck = tmp_path / "run" / "checkpoint.pt"
    with pytest.raises(ValueError, match="another model config.*num_hidden_layers"):
        load_checkpoint(ck, model_config={**torch.load(ck, weights_only=True)["model_config"],
                                           "num_hidden_layers": 3})
    ck.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        train(_cfg(tmp_path, steps=2, resume=True), tokenizer=tiny_tokenizer)


@pytest.mark.parametrize("kw,match", [
    (dict(pe="xpos"), "unknown positional scheme"),
    (dict(context=0), "context must be positive"),
    (dict(optimizer="sgd"), "unknown optimizer"),
    (dict(model_overrides=dict(TINY_MODEL, vocab_size=100)),
     r"tokenizer has \d+ tokens but the model vocabulary is 100"),
])
def test_bad_input_errors(tmp_path, tiny_tokenizer, corpus, kw, match):
    with pytest.raises(ValueError, match=match):
        train(_cfg(tmp_path, **kw), tokenizer=tiny_tokenizer)


def test_empty_corpus_error(tmp_path, tiny_tokenizer):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("   \n")
    with pytest.raises(ValueError, match="empty corpus"):
        train(_cfg(tmp_path), tokenizer=tiny_tokenizer)


def test_cli_train(tmp_path, tiny_tokenizer, corpus):
    import typer
    from typer.testing import CliRunner

    from posbias.cli import train_cmd

    app = typer.Typer()
    train_cmd.register(app)
    app.command("noop")(lambda: None)  # keep typer in multi-command mode
    tok_dir = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok_dir)
    args = ["train", "--out", str(tmp_path / "cli"), "--pe", "alibi", "--ssmax", "--steps", "2", "--context", "32",
            "--batch-size", "2", "--tokenizer", str(tok_dir), "--corpus", str(corpus), "--warmup", "1",
            "--optimizer", "radam", "--model-opt", "num_hidden_layers=1", "--model-opt", "hidden_size=32",
            "--model-opt", "intermediate_size=64"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cli" / "final" / "model.safetensors").exists()
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "cli2"), "--pe", "xpos"] + args[5:])
    assert res.exit_code == 2 and "unknown positional scheme" in res.output


class _Payload:
    """Unpickling this object creates ``marker``: the code a planted checkpoint would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_payload_in_the_checkpoint_does_not_run_on_resume(tmp_path, tiny_tokenizer, corpus):
    import typer
    from typer.testing import CliRunner

    from posbias.cli import train_cmd

    app = typer.Typer()
    train_cmd.register(app)
    app.command("noop")(lambda: None)
    tok_dir = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok_dir)
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--pe", "rope", "--steps", "2", "--context", "32", "--batch-size", "2",
            "--tokenizer", str(tok_dir), "--corpus", str(corpus), "--warmup", "1", "--checkpoint-every", "1",
            "--model-opt", "num_hidden_layers=1", "--model-opt", "hidden_size=32", "--model-opt",
            "intermediate_size=64"]
    assert CliRunner().invoke(app, args).exit_code == 0
    good = torch.load(out / "checkpoint.pt", weights_only=True)  # what posbias writes loads without pickle
    marker = tmp_path / "pwned"
    torch.save({**good, "rng": _Payload(marker)}, out / "checkpoint.pt")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and not marker.exists()
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "only pickle can load" in lines[0] and "not loaded" in lines[0], res.output
    # an older checkpoint (RNG states as numpy arrays) is refused the same way, not unpickled
    torch.save({**good, "rng": {"numpy": np.random.get_state()}}, out / "checkpoint.pt")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "only pickle can load" in res.output


DDP_SCRIPT = """
import sys, json, hashlib, torch
sys.path.insert(0, {tests!r})
from conftest import make_tiny_tokenizer
from posbias.training import TrainConfig, train

sums = []
def cb(step, model, info):
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    sums.append(hashlib.sha1(flat.numpy().tobytes()).hexdigest())
    if step == 2:
        open({out!r} + f"/rank{{info.rank}}.json", "w").write(json.dumps({{"world": info.world_size, "sums": sums}}))

train(TrainConfig(out={out!r} + "/run", steps=2, context=32, batch_size=2, warmup_steps=1, log_every=1,
                  checkpoint_every=2, corpus=[{corpus!r}], progress=False, pe="ggd", ssmax=True,
                  model_overrides={model!r}), tokenizer=make_tiny_tokenizer(), callback=cb)
"""


def test_ddp_two_cpu_processes_stay_in_sync(tmp_path, corpus):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parents[1]), out=str(tmp_path), corpus=str(corpus),
                                        model=TINY_MODEL))
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # kill torchrun and its workers, never leave them running
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert r0["sums"] == r1["sums"] and len(r0["sums"]) == 2
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["tokens"] == 2 * 2 * 32 * 2  # steps x batch x context x world


def test_passkey_probe_spans_and_logging(tmp_path, tiny_tokenizer, corpus):
    from posbias.training.probe import passkey_probe, passkey_probe_docs

    ds = PackedDataset(load_texts([corpus]), tiny_tokenizer, 320, passkey_rate=0.0)
    docs = passkey_probe_docs(ds, 4)
    assert len(docs) == 4
    for d in docs:
        answer = tiny_tokenizer.decode(d.ids[d.start:d.end]).strip()
        before = tiny_tokenizer.decode(d.ids[:d.start])
        assert answer.isdigit() and len(answer) == 5 and before.endswith("The pass key is") and d.end == len(d.ids)
    assert [d.ids.tolist() for d in passkey_probe_docs(ds, 4)] == [d.ids.tolist() for d in docs]  # fixed

    class Oracle(torch.nn.Module):  # puts all mass on the true next token
        def __init__(self, ids):
            super().__init__()
            self.ids, self.w = ids, torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, use_cache=False, attention_mask=None, position_ids=None, logits_to_keep=0):
            nxt = torch.cat([input_ids[0, 1:], input_ids[0, :1]])
            logits = torch.nn.functional.one_hot(nxt, 600)[None].float() * 50
            return type("O", (), {"logits": logits[:, -logits_to_keep:] if logits_to_keep else logits})()

    res = passkey_probe(Oracle(None), docs)
    assert res["passkey_em"] == 1.0 and -1e-6 < res["passkey_logprob"] <= 0

    cfg = _cfg(tmp_path, context=320, steps=2, probe_every=1, probe_n=2, checkpoint_every=2)
    train(cfg, tokenizer=tiny_tokenizer)
    probes = [r for r in (json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
              if "passkey_em" in r]
    assert [r["step"] for r in probes] == [1, 2] and all(0 <= r["passkey_em"] <= 1 and r["passkey_logprob"] < 0
                                                         for r in probes)
    with pytest.raises(ValueError, match="probe_every"):
        _cfg(tmp_path, probe_every=-1).validate()


def test_a_niah_probe_beside_the_passkey_one_and_a_target_that_needs_both(tmp_path, tiny_tokenizer, corpus,
                                                                          monkeypatch):
    import posbias.training.trainer as trainer
    from posbias.training.probe import niah_probe_docs, probe_docs

    ds = PackedDataset(load_texts([corpus]), tiny_tokenizer, 320)
    docs = niah_probe_docs(ds, 3)
    assert len(docs) == 3 and [d.ids.tolist() for d in niah_probe_docs(ds, 3)] == [d.ids.tolist() for d in docs]
    for d in docs:
        answer = tiny_tokenizer.decode(d.ids[d.start:d.end]).strip()
        assert answer.isdigit() and len(answer) == 7 and d.end == len(d.ids)
    assert set(probe_docs(ds, 2, ("passkey", "niah"))) == {"passkey", "niah"}
    scripted = iter([{"passkey_em": 1.0, "niah_em": 0.5}, {"passkey_em": 1.0, "niah_em": 1.0},
                     {"passkey_em": 1.0, "niah_em": 1.0}] + [{"passkey_em": 1.0, "niah_em": 1.0}] * 5)
    seen = []
    monkeypatch.setattr(trainer, "run_probes", lambda model, docs: seen.append(sorted(docs)) or next(scripted))
    cfg = _cfg(tmp_path, context=320, steps=8, probe_every=1, probe_n=2, probe_target=0.95, probe_patience=2,
               probe_tasks="passkey,niah", checkpoint_every=4, log_every=1)
    train(cfg, tokenizer=tiny_tokenizer)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert seen[0] == ["niah", "passkey"]
    assert [r["step"] for r in rows if r.get("stopped_by")] == [3]  # passkey alone would have stopped at 2
    assert trainer.probe_streak(rows, 0.95, ("passkey", "niah")) == 2 and trainer.probe_streak(rows, 0.95) == 3
    with pytest.raises(ValueError, match="probe_tasks must name"):
        _cfg(tmp_path, probe_tasks="passkey,kv").validate()


def test_training_stops_once_the_probe_holds_its_target_and_stays_stopped(tmp_path, tiny_tokenizer, corpus,
                                                                        monkeypatch):
    import posbias.training.trainer as trainer

    scripted = iter([0.5, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    monkeypatch.setattr(trainer, "run_probes", lambda model, docs: {"passkey_em": next(scripted),
                                                                    "passkey_logprob": -1.0})
    cfg = _cfg(tmp_path, context=320, steps=10, probe_every=1, probe_n=2, probe_target=0.95, probe_patience=2,
               checkpoint_every=4, log_every=1)
    final = train(cfg, tokenizer=tiny_tokenizer)
    assert (final / "model.safetensors").exists()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if "loss" in r) == 5  # em 0.5, 1, 0.9, 1, 1: two in a row at step 5
    stop = [r for r in rows if r.get("stopped_by")]
    assert stop == [{"step": 5, "stopped_by": "probe_target", "probe_target": 0.95, "tokens": 5 * 2 * 320}]
    assert trainer.probe_streak(rows, 0.95) == 2
    # resuming a run that reached its target trains no further
    train(dataclasses_replace(cfg, resume=True), tokenizer=tiny_tokenizer)
    again = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in again if "loss" in r) == 5


def test_a_probe_target_that_is_never_reached_trains_to_the_cap(tmp_path, tiny_tokenizer, corpus, monkeypatch):
    import posbias.training.trainer as trainer

    monkeypatch.setattr(trainer, "run_probes", lambda model, docs: {"passkey_em": 0.5, "passkey_logprob": -9.0})
    cfg = _cfg(tmp_path, context=320, steps=4, probe_every=2, probe_n=2, probe_target=0.95)
    train(cfg, tokenizer=tiny_tokenizer)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if "loss" in r) == 4 and not any("stopped_by" in r for r in rows)
    for bad, message in (({"probe_target": 0.9}, "needs probe_every"),
                         ({"probe_target": 1.5, "probe_every": 1}, r"in \[0, 1\]"),
                         ({"probe_target": 0.9, "probe_every": 1, "probe_patience": 0}, "probe_patience")):
        with pytest.raises(ValueError, match=message):
            _cfg(tmp_path, **bad).validate()


def test_final_step_ends_the_run_with_a_final_model_on_the_full_schedule(tmp_path, tiny_tokenizer, corpus):
    """final_step keeps the model of that step as the final one; its learning rate is the one of the full
    schedule (not a shorter one), and a resume with a later final_step continues it exactly."""
    full = train(_cfg(tmp_path, out=str(tmp_path / "full"), steps=6, checkpoint_every=1, log_every=1),
                 tokenizer=tiny_tokenizer)
    cut = train(_cfg(tmp_path, out=str(tmp_path / "cut"), steps=6, checkpoint_every=1, log_every=1, final_step=3),
                tokenizer=tiny_tokenizer)
    assert cut == tmp_path / "cut" / "final" and (cut / "model.safetensors").exists()
    rows = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    whole = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert [r["lr"] for r in rows if "loss" in r] == [r["lr"] for r in whole if "loss" in r][:3]
    assert [r for r in rows if r.get("stopped_by")] == [{"step": 3, "stopped_by": "final_step", "tokens": 3 * 2 * 32}]
    resumed = train(_cfg(tmp_path, out=str(tmp_path / "cut"), steps=6, checkpoint_every=1, log_every=1, resume=True),
                    tokenizer=tiny_tokenizer)
    a, b = _weights(full), _weights(resumed)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    with pytest.raises(ValueError, match=r"final_step must lie in \[1, steps = 6\]"):
        _cfg(tmp_path, steps=6, final_step=7).validate()


def dataclasses_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def test_a_corpus_sentence_longer_than_the_filler_never_starts_one(tiny_tokenizer, tmp_path):
    """A corpus whose sentences are mostly longer than a whole passkey document (it broke a study at
    its first batches: a negative padding length deep inside torch): every corpus-filled passkey
    document still fits the context, from a sentence that fits its budget."""
    long = " ".join(["alpha beta gamma delta"] * 200) + "."
    short = [f"Short sentence number {i} is here." for i in range(30)]
    text = "\n".join(x for i, s in enumerate(short) for x in ([long, s] if i % 3 == 0 else [s]))
    ds = PackedDataset([text] * 4, tiny_tokenizer, 320, passkey_rate=1.0, seed=1, passkey_haystack="corpus")
    for k in range(30):
        ids, docs = ds.block(k)
        n = int((docs == docs[0]).sum())
        assert ids.shape == (320,) and n <= 320 and "alpha beta" not in tiny_tokenizer.decode(ids[:n])
    only_long = PackedDataset([long] * 4, tiny_tokenizer, 320, passkey_rate=1.0, seed=1, passkey_haystack="corpus")
    with pytest.raises(ValueError, match="no training-corpus sentence fits"):
        only_long.block(0)


def test_progress_bar_names_the_ssmax_scope():
    """The study's ggd+ssmax-content run is not labelled as plain ggd+ssmax."""
    content = TrainConfig(pe="ggd", ssmax=True, model_overrides={"ssmax_scope": "content"})
    assert [run_label(c) for c in (TrainConfig(pe="rope"), TrainConfig(pe="ggd", ssmax=True), content)] == \
        ["rope", "ggd+ssmax", "ggd+ssmax-content"]


@pytest.mark.parametrize("pe", ["kerple-log", "kerple-power", "fire"])
def test_the_new_priors_train_and_kerple_stays_in_its_domain(tmp_path, tiny_tokenizer, corpus, pe):
    """A few steps of each new prior: the loss is finite, the prior's parameters move, and a prior learning
    rate large enough to push KERPLE's parameters below zero leaves them clamped at their bound."""
    from posbias.positional.kerple import EPS

    seen = []

    def record(step, model, info):
        seen.append({n: p.detach().clone() for n, p in model.named_parameters() if ".priors." in n})

    run = train(_cfg(tmp_path, pe=pe, ssmax=False, steps=3, prior_lr=1.0), tokenizer=tiny_tokenizer,
                callback=record)
    logged = [json.loads(x) for x in (run.parent / "metrics.jsonl").read_text().splitlines()]
    assert logged and all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
    assert (run / "model.safetensors").exists()
    assert len(seen) == 3 and any(not torch.equal(seen[0][n], seen[-1][n]) for n in seen[0])
    if pe.startswith("kerple"):
        values = torch.cat([v for v in seen[-1].values()])
        assert values.min().item() == pytest.approx(EPS) and (values >= EPS - 1e-7).all()
        assert all("r2_mean" in r for r in logged if "loss" in r)  # the log line follows the kernel
    else:
        assert all(r["fire_threshold_mean"] > 0 for r in logged if "loss" in r)


@pytest.mark.parametrize("pe", ["kerple-log", "kerple-power", "fire"])
def test_cli_train_takes_the_new_priors_by_name(tmp_path, tiny_tokenizer, corpus, pe):
    import typer
    from typer.testing import CliRunner

    from posbias.cli import train_cmd

    app = typer.Typer()
    train_cmd.register(app)
    app.command("noop")(lambda: None)
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "cli"), "--pe", pe, "--steps", "2", "--context",
                                   "32", "--batch-size", "2", "--tokenizer", str(tmp_path / "tok"), "--corpus",
                                   str(corpus), "--warmup", "1", "--model-opt", "num_hidden_layers=1",
                                   "--model-opt", "hidden_size=32", "--model-opt", "intermediate_size=64"])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "cli" / "final" / "config.json").read_text())
    assert saved["pe"] == pe and (tmp_path / "cli" / "final" / "model.safetensors").exists()


def test_the_progress_line_shows_the_last_probe_beside_the_loss(tmp_path, tiny_tokenizer, corpus, monkeypatch,
                                                               capsys):
    import sys

    import posbias.training.trainer as trainer
    from posbias.training.probe import probe_postfix

    assert probe_postfix({"passkey_em": 0.85, "passkey_logprob": -1.0, "niah_em": None}) == {"passkey": "85%"}
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.setattr(trainer, "run_probes", lambda model, docs: {"passkey_em": 0.5, "passkey_logprob": -1.0})
    train(_cfg(tmp_path, context=320, steps=10, probe_every=5, probe_n=2, log_every=5, progress=True),
          tokenizer=tiny_tokenizer)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("train ")]
    assert lines and "loss=" in lines[-1] and "passkey=50%" in lines[-1], lines
