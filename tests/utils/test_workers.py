"""Spawned workers: one GPU each on a CUDA machine (CUDA_VISIBLE_DEVICES, in turn over the visible
GPUs), the CPU threads split on a machine without; a search gives the same result with 1 or 2 workers."""
import json
import os

import torch
from conftest import save_tiny_folder

from posbias.utils.workers import gpu_slots, spawn_pool


def _visible(_=None) -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def _fake_gpus(monkeypatch, count: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_gpu_slots_go_round_the_visible_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_gpus(monkeypatch, 8)
    assert gpu_slots(8) == [str(i) for i in range(8)]
    _fake_gpus(monkeypatch, 2)
    assert gpu_slots(3) == ["0", "1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert gpu_slots(2) == ["4", "6"]


def test_shard_gives_each_worker_a_run_of_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_gpus(monkeypatch, 8)
    assert gpu_slots(2, shard=True) == ["0,1,2,3", "4,5,6,7"]
    assert gpu_slots(3, shard=True) == ["0,1", "2,3", "4,5"]
    assert gpu_slots(1, shard=True) == ["0,1,2,3,4,5,6,7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    _fake_gpus(monkeypatch, 2)
    assert gpu_slots(3, shard=True) == ["4", "6", "4"]


def test_no_gpu_slots_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_slots(4) is None


def test_each_spawned_worker_sees_its_own_gpu():
    pool = spawn_pool(2, gpus=["3", "5"])
    try:
        seen = {pool.submit(_visible).result() for _ in range(8)}
        futures = [pool.submit(_visible) for _ in range(8)]
        seen |= {f.result() for f in futures}
    finally:
        pool.shutdown()
    assert seen <= {"3", "5"} and seen


def test_search_with_two_workers_equals_one(tmp_path):
    """The same seed gives the same search (history and factors) with 1 or 2 spawned workers."""
    from posbias.search.config import SearchConfig
    from posbias.search.runner import run_search

    model = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    settings = dict(task="kv", preset="quick", seed=3, curve="linear", task_options={"num_keys": 4},
                    overrides={"population": 3, "generations": 2, "n_per_depth": 1, "batch_size": 3})
    one = run_search(SearchConfig(model=model, out=str(tmp_path / "one"), workers=1, **settings))
    two = run_search(SearchConfig(model=model, out=str(tmp_path / "two"), workers=2, **settings))
    assert one.factors == two.factors and one.accuracy == two.accuracy
    lines = [[_untimed(json.loads(line)) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
             for d in ("one", "two")]
    assert lines[0] == lines[1] and len(lines[0]) == 2


def _untimed(value):
    """A record without its timings (``*_s``, ``seconds``: they differ between runs)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not (k.endswith("_s") or k == "seconds")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def test_tune_with_two_workers_equals_one(tmp_path):
    """The baselines' tuning scores the same settings to the same records with 1 or 2 spawned workers."""
    from posbias.search.tune import TuneConfig, tune_methods
    from posbias.utils.io import read_jsonl

    model = save_tiny_folder(tmp_path / "tiny", max_positions=4096)
    grids = {"pi": [{"factor": 1.0}, {"factor": 1.5}, {"factor": 2.0}]}
    runs = {}
    for workers in (1, 2):
        cfg = TuneConfig(model=model, task="kv", methods=["pi"], n_per_depth=1, out=tmp_path / f"w{workers}",
                         task_options={"num_keys": 4}, grids=grids, workers=workers)
        best = tune_methods(cfg, log=lambda _: None)
        runs[workers] = (best, [_untimed(r) for r in read_jsonl(tmp_path / f"w{workers}" / "results.jsonl")])
    assert runs[1] == runs[2] and len(runs[1][1]) == 3


def test_search_workers_follow_the_device(monkeypatch):
    from posbias.models.options import LoadOptions
    from posbias.search.runner import worker_gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_gpus(monkeypatch, 4)
    assert worker_gpus(LoadOptions("auto"), 2) == ["0", "1"]
    assert worker_gpus(LoadOptions("shard"), 2) == ["0,1", "2,3"]
    assert worker_gpus(LoadOptions("cuda:1"), 2) is None
