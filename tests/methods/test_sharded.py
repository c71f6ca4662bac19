"""Every method on a model split over two devices, as ``--device shard`` (transformers'
``device_map="auto"``) splits one over several GPUs: accelerate's ``AlignDevicesHook`` on each later
module moves its inputs to that module's device. This machine has one real device, so the second is
``meta`` (shapes only, no data): an operation that mixes a CPU tensor into a meta layer's elementwise
arithmetic fails, which is what a method building tensors on the model's first device, or caching
them across layers of different devices, would do on several GPUs. Data-dependent steps (the
rotated-key reuse check, sparse expert selection) cannot run on meta and are switched off here.

And a real split, with data: transformers' own ``device_map`` offloading some layers to disk (what
``shard`` does with layers the GPUs cannot hold), where each method must give the one-device logits.
"""
from __future__ import annotations

import json

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from conftest import left_padded_batch, make_variant_model

from posbias.architecture.layers import get_decoder_layers
from posbias.methods import apply_method

SECOND = torch.device("meta")
SETTINGS = {
    "pi": {"factor": 4.0},
    "lpes": {"factors": [1.0, 2.0, 3.0, 4.0]},
    "ms-poe": {"skip_layers": 0, "r_min": 2.0, "r_max": 4.0, "rotated_cache": False},
    "attention-buckets": {"multipliers": [0.01, 1.0]},
    "moice": {"top_k": 3, "multipliers": [0.01, 1.0, 100.0], "rotated_cache": False},
    "temperature": {"values": [0.5, 1.0, 1.5, 2.0]},
    "positional-hidden": {"dims": [1, 5, 9], "layers": [1, 2], "factor": -1.0, "last_recompute_tokens": 2},
}


def split_model(arch: str, first: int = 2):
    """A tiny 4-layer bf16 model: embeddings, rotary and layers ``< first`` on the CPU, the later
    layers, final norm and LM head on :data:`SECOND`, each with accelerate's device-alignment hook."""
    model = make_variant_model(arch, layers=4).to(torch.bfloat16)
    model.set_attn_implementation("sdpa")
    for module in [*get_decoder_layers(model)[first:], model.model.norm, model.lm_head]:
        module.to(SECOND)
        add_hook_to_module(module, AlignDevicesHook(execution_device=SECOND))
    return model


def options(name: str, tmp_path, table: dict = SETTINGS) -> dict:
    """The method's options from ``table``; lpes reads its factors from a file."""
    opts = dict(table[name])
    if name == "lpes":
        path = tmp_path / "factors.json"
        path.write_text(json.dumps({"format": "posbias-lpes-factors", "version": 1,
                                    "num_layers": len(opts["factors"]), "factors": opts["factors"]}))
        opts["factors"] = str(path)
    return opts


def prefill_and_step(model):
    ids, mask, pos = left_padded_batch(t=24)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        nxt = torch.ones(ids.shape[0], 1, dtype=torch.long)  # the logits hold no data to pick a token from
        step = model(input_ids=nxt, attention_mask=torch.cat([mask, torch.ones_like(nxt)], 1),
                     position_ids=pos[:, -1:] + 1, cache=out.past_key_values, use_cache=True)
    return out.logits, step.logits


def test_the_split_catches_a_tensor_left_on_the_first_device():
    """The simulation is strict enough: CPU data in a meta layer's arithmetic is an error."""
    with pytest.raises(RuntimeError, match="device"):
        torch.ones(2, device=SECOND) * torch.ones(2)


@pytest.mark.filterwarnings("ignore:moice")
@pytest.mark.parametrize("arch", ["llama", "qwen2-gqa7", "gemma3"])
@pytest.mark.parametrize("name", ["none", *SETTINGS])
def test_every_method_runs_on_a_model_split_over_two_devices(name, arch, tmp_path):
    model = split_model(arch)
    if name == "none":
        logits = prefill_and_step(model)
    else:
        with apply_method(model, name, **options(name, tmp_path)) as h:
            logits = prefill_and_step(h.model)
            if name == "moice":  # each layer's router sits with its layer
                layers = get_decoder_layers(model)
                for i, router in h.state["routers"].routers.items():
                    want = next(layers[int(i)].parameters()).device
                    assert {p.device for p in router.parameters()} == {want}
    assert [x.device for x in logits] == [SECOND, SECOND]
    assert logits[0].shape[:2] == (3, 24) and logits[1].shape[:2] == (3, 1)


def offloaded_pair(tmp_path, embeddings: str):
    """A tiny 3-layer Llama loaded twice from one folder: on the CPU, and with transformers' own
    ``device_map`` offloading layers 1-2 (and the embeddings, given ``"disk"``) to disk."""
    from conftest import make_tiny_model
    from transformers import AutoModelForCausalLM

    make_tiny_model("llama", layers=3).save_pretrained(tmp_path / "model")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    where = {"model.embed_tokens": embeddings, "model.rotary_emb": "cpu", "model.layers.0": "cpu",
             "model.layers.1": "disk", "model.layers.2": "disk", "model.norm": "cpu", "lm_head": "cpu"}
    offloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", device_map=where,
                                                     offload_folder=tmp_path / "offload").eval()
    return plain, offloaded


@pytest.mark.filterwarnings("ignore")
def test_every_method_on_layers_offloaded_to_disk_equals_the_model_on_one_device(tmp_path):
    """Offloaded layers keep their weights on ``meta`` and compute on the execution device of their
    accelerate hook: a method that places state by a layer's parameters (MoICE's routers did) gets
    ``meta`` there, and a CPU ``linear`` with a ``meta`` weight returns garbage without an error."""
    plain, offloaded = offloaded_pair(tmp_path, embeddings="cpu")
    assert next(get_decoder_layers(offloaded)[1].parameters()).device == SECOND
    ids = torch.randint(3, 400, (2, 20), generator=torch.Generator().manual_seed(0))
    settings = {**SETTINGS, "lpes": {"factors": [1.0, 2.0, 3.0]}, "temperature": {"values": [0.5, 1.5, 2.0]},
                "moice": {"top_k": 2, "multipliers": [0.5, 1.0, 2.0]}}  # sparse routing runs with data
    for name in ("none", *settings):
        opts = options(name, tmp_path, settings) if name != "none" else {}
        logits = []
        for model in (plain, offloaded):
            with torch.no_grad(), apply_method(model, name, **opts) as h:
                logits.append(h.model(ids).logits)
        assert torch.equal(*logits), (name, (logits[0] - logits[1]).abs().max())


def test_moice_load_balancing_loss_gathers_the_layers_terms():
    """train-moice adds one load-balancing term per layer; on a split model they sit on two devices."""
    from posbias.methods.moice import MoICE

    state = MoICE.__new__(MoICE)
    state.aux = [torch.tensor(1.0), torch.tensor(3.0, device=SECOND)]
    loss = state.aux_loss()
    assert loss.device == SECOND and state.aux == []


@pytest.mark.filterwarnings("ignore")
def test_the_scoring_core_on_layers_offloaded_to_disk_equals_one_device(tmp_path):
    """Batched and shared-context teacher forcing (one prefill repeated for several questions) and
    greedy generation give the same records on a model with its embeddings and layers offloaded by
    ``device_map`` (the inputs go where the embeddings compute, not to their ``meta`` weights)."""
    from conftest import make_tiny_tokenizer

    from posbias.evaluation.generation import greedy_generate
    from posbias.evaluation.teacher_forced import score_instances
    from posbias.tasks import make_instances

    tok = make_tiny_tokenizer()
    plain, offloaded = offloaded_pair(tmp_path, embeddings="disk")
    assert offloaded.get_input_embeddings().weight.device == SECOND
    insts = make_instances("kv", tokenizer=tok, n=2, depths=[0.0, 1.0], seed=0, num_keys=4, shared_context=True)
    runs = [(score_instances(m, tok, insts, batch_size=2, shared=True),
             score_instances(m, tok, insts, batch_size=2, shared=False),
             greedy_generate(m, tok, insts, batch_size=2)) for m in (plain, offloaded)]
    assert runs[0] == runs[1]
