"""--device / --dtype resolution (posbias.utils.devices): auto, explicit names, and one-line refusals."""
import pytest
import torch

from posbias.utils.devices import Placement, resolve_device, resolve_dtype, resolve_placement


def test_auto_is_the_first_gpu_in_bf16_else_the_cpu_in_fp32():
    placed = resolve_placement()
    if torch.cuda.is_available():
        assert (placed.device, placed.dtype) == (torch.device("cuda:0"), torch.bfloat16)
    else:
        assert (placed.device, placed.dtype) == (torch.device("cpu"), torch.float32)
    assert placed.record() == {"device": "auto", "dtype": "auto", "resolved_device": str(placed.device),
                               "resolved_dtype": str(placed.dtype).removeprefix("torch.")}


@pytest.mark.parametrize("name, dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                         ("float16", torch.float16), ("bf16", torch.bfloat16),
                                         (torch.float16, torch.float16)])
def test_dtype_names(name, dtype):
    assert resolve_dtype(name, torch.device("cpu")) == dtype


def test_cpu_is_accepted_in_every_spelling():
    cpu = torch.device("cpu")
    assert resolve_device("cpu") == resolve_device(cpu) == resolve_device(" CPU ") == cpu
    assert Placement("cpu", "bfloat16").resolve().dtype == torch.bfloat16


@pytest.mark.parametrize("name, needle", [("gpu", "is not a device"), ("cuda:x", "is not a device"),
                                          ("meta", "is not supported")])
def test_unknown_device_is_one_line(name, needle):
    with pytest.raises(ValueError, match=needle) as e:
        resolve_device(name)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_one_line(name):
    with pytest.raises(ValueError, match=f"--device {name}: .*use --device cpu") as e:
        resolve_device(name)
    assert "\n" not in str(e.value)


def test_unknown_dtype_is_one_line():
    with pytest.raises(ValueError, match="--dtype 'int8' is not a dtype: give auto | float32"):
        resolve_dtype("int8")


def _fake_gpus(monkeypatch, count: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_shard_puts_inputs_on_the_first_gpu_and_the_layers_over_all(monkeypatch):
    _fake_gpus(monkeypatch, 4)
    placed = Placement("shard", "auto").resolve()
    assert (placed.device, placed.dtype, placed.device_map()) == (torch.device("cuda:0"), torch.bfloat16, "auto")
    assert placed.record()["resolved_device"] == "shard over 4 GPUs"
    assert Placement("cuda:1", "auto").resolve().device_map() == {"": "cuda:1"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_shard_without_a_gpu_is_one_line():
    with pytest.raises(ValueError, match="--device shard: .*use --device cpu") as e:
        Placement("shard", "auto").resolve()
    assert "\n" not in str(e.value)


def test_shard_is_for_loading_only():
    """Training resolves one device: ``shard`` is refused there in one line."""
    with pytest.raises(ValueError, match="--device shard splits a pretrained model"):
        resolve_device("shard")
