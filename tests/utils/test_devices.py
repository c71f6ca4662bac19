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
