"""--device / --dtype resolution (posbias.utils.devices): auto, explicit names, and one-line refusals."""
import pytest
import torch

from posbias.utils.devices import Placement, resolve_device, resolve_dtype, resolve_placement


def test_auto_is_the_first_gpu_in_bf16_else_the_cpu_in_fp32():
    """(conftest sets POSBIAS_CPU_AUTO_DTYPE=float32: the CPU stays float32 on every machine.)"""
    placed = resolve_placement()
    if torch.cuda.is_available():
        assert (placed.device, placed.dtype) == (torch.device("cuda:0"), torch.bfloat16)
    else:
        assert (placed.device, placed.dtype) == (torch.device("cpu"), torch.float32)
    record = {"device": "auto", "dtype": "auto", "resolved_device": str(placed.device),
              "resolved_dtype": str(placed.dtype).removeprefix("torch.")}
    if placed.device.type == "cpu":
        record["dtype_reason"] = "POSBIAS_CPU_AUTO_DTYPE=float32"
    assert placed.record() == record


@pytest.mark.parametrize("flags, dtype, reason", [
    (("avx512_bf16",), torch.bfloat16, "this CPU computes bfloat16 natively (avx512_bf16)"),
    (("amx_bf16", "avx512_bf16"), torch.bfloat16, "this CPU computes bfloat16 natively (amx_bf16)"),
    ((), torch.float32, "this CPU has no native bfloat16"),
])
def test_auto_on_the_cpu_is_bfloat16_where_the_cpu_computes_it(monkeypatch, flags, dtype, reason):
    from posbias.utils import devices

    monkeypatch.delenv("POSBIAS_CPU_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(devices, "cpu_bf16_flags", lambda: flags)
    placed = Placement("cpu", "auto").resolve()
    assert placed.dtype == dtype and placed.record()["dtype_reason"] == reason
    assert Placement("cpu", "float32").resolve().dtype == torch.float32  # only auto follows the CPU
    assert "dtype_reason" not in Placement("cpu", "float32").resolve().record()
    monkeypatch.setenv("POSBIAS_CPU_AUTO_DTYPE", "float32")
    assert Placement("cpu", "auto").resolve().dtype == torch.float32


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    from pathlib import Path

    from posbias.utils import devices

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 avx2\n")
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(info) if str(self) == "/proc/cpuinfo"
                        else real(self, *a, **k))
    devices.cpu_bf16_flags.cache_clear()
    try:
        assert devices.cpu_bf16_flags() == ("avx512_bf16",)
    finally:
        devices.cpu_bf16_flags.cache_clear()


def test_a_folder_begun_in_float32_under_auto_says_how_to_resume(tmp_path, monkeypatch):
    """--dtype auto picks bfloat16 on such a CPU now: an auto folder of a float32 run says --dtype float32."""
    from posbias.utils.run_folder import open_run

    old = {"n": 1, "dtype": "float32", "load": {"dtype": "auto", "resolved_dtype": "float32"}}
    open_run(tmp_path / "f", "eval", old, check_keys=("n", "dtype")).commit()
    new = {"n": 1, "dtype": "bfloat16", "load": {"dtype": "auto", "resolved_dtype": "bfloat16"}}
    with pytest.raises(ValueError, match=r"--dtype auto gives bfloat16 here; --dtype float32 resumes this folder"):
        open_run(tmp_path / "f", "eval", new, check_keys=("n", "dtype"))


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
