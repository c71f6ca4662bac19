"""Where a model runs and in which dtype: the one resolution of ``--device`` and ``--dtype``.

``--device``: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` | ``mps`` | ``shard``; ``--dtype``: ``auto`` |
``float32`` | ``bfloat16`` | ``float16``. ``auto`` is the first CUDA device in bfloat16 when one is present,
else the CPU: in bfloat16 when the CPU computes it natively (``avx512_bf16`` or ``amx_bf16``: ~2x faster
prefill there, and on a 4K-token test bed 149 of 150 verdicts equal float32's,
docs/results/where-the-middle-is-lost), in float32 otherwise or with ``POSBIAS_CPU_AUTO_DTYPE=float32``
(:func:`resolve_placement`); the run folder records which and why (``dtype_reason``). ``shard`` splits a
pretrained model's layers over every visible GPU (transformers' ``device_map="auto"``), for a model that one
GPU cannot hold; inputs go to the first GPU. A device or dtype this machine cannot use is a ``ValueError`` of
one line, raised before any model loads or any run folder is touched.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N | mps"
SHARD = "shard"  # a pretrained model's layers over every visible GPU (loading only; training runs on one device)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 CPU flags of bfloat16 matrix arithmetic
AUTO_CPU_DTYPE_ENV = "POSBIAS_CPU_AUTO_DTYPE"  # float32: --dtype auto stays float32 on every CPU


@functools.lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """The native-bfloat16 flags of this CPU (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(f for f in NATIVE_BF16_FLAGS if f in flags)


def auto_cpu_dtype() -> tuple[torch.dtype, str]:
    """``--dtype auto`` on the CPU: ``(dtype, why)``."""
    if os.environ.get(AUTO_CPU_DTYPE_ENV, "").strip().lower() in ("float32", "fp32"):
        return torch.float32, f"{AUTO_CPU_DTYPE_ENV}=float32"
    flags = cpu_bf16_flags()
    if flags:
        return torch.bfloat16, f"this CPU computes bfloat16 natively ({flags[0]})"
    return torch.float32, "this CPU has no native bfloat16"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The device ``name`` stands for on this machine; ``ValueError`` naming the problem if it has none.

    ``auto``: ``cuda:0`` when CUDA is present, else ``cpu``; ``cuda``: ``cuda:0`` (the first visible GPU).
    """
    if isinstance(name, torch.device):
        name = str(name)
    text = str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if text == SHARD:
        raise ValueError("--device shard splits a pretrained model over the GPUs as it loads; training and "
                         "this use run on one device (give cuda or cuda:N)")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {name!r} is not a device: give {DEVICE_CHOICES}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        return _cuda_device(name, device)
    if device.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"--device {name}: no Apple MPS device on this machine (use --device cpu)")
        return device
    raise ValueError(f"--device {name!r} is not supported: give {DEVICE_CHOICES}")


def resolve_shard() -> torch.device:
    """``--device shard``: the first visible GPU, where the inputs of a model split over all of them go."""
    return _cuda_device(SHARD, torch.device("cuda:0"))


def visible_gpu_count() -> int:
    """How many CUDA GPUs this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cuda_device(name: str, device: torch.device) -> torch.device:
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"--device {name}: {why} (use --device cpu or auto)")
    index = device.index or 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"--device {name}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def resolve_dtype(name: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """The weight dtype ``name`` stands for on ``device``; ``auto``: bfloat16 on CUDA, on the CPU
    :func:`auto_cpu_dtype`, else float32.

    ``ValueError`` for an unknown name, or bfloat16 on a GPU without bfloat16 support.
    """
    device = device if device is not None else torch.device("cpu")
    if isinstance(name, torch.dtype):
        name = dtype_name(name)
    text = DTYPE_ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if text == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return auto_cpu_dtype()[0] if device.type == "cpu" else torch.float32
    if text not in DTYPES:
        raise ValueError(f"--dtype {name!r} is not a dtype: give auto | {' | '.join(DTYPES)}")
    dtype = DTYPES[text]
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bfloat16: {torch.cuda.get_device_name(device)} has no bfloat16 support "
                         "(use --dtype float16 or float32)")
    return dtype


@dataclass(frozen=True)
class Placement:
    """A requested ``device`` / ``dtype`` pair (strings as the command line spells them)."""

    device: str = "auto"
    dtype: str = "auto"

    @property
    def shards(self) -> bool:
        """Whether the request splits the model over every visible GPU (``--device shard``)."""
        return str(self.device).strip().lower() == SHARD

    def resolve(self) -> ResolvedPlacement:
        """This machine's device and dtype for the request (``ValueError`` when it has none)."""
        device = resolve_shard() if self.shards else resolve_device(self.device)
        return ResolvedPlacement(self, device, resolve_dtype(self.dtype, device))


@dataclass(frozen=True)
class ResolvedPlacement:
    """A :class:`Placement` resolved on this machine."""

    requested: Placement
    device: torch.device  # with ``shard``: the first GPU (the inputs' device)
    dtype: torch.dtype

    def device_map(self) -> str | dict:
        """transformers' ``device_map``: ``"auto"`` for ``shard`` (layers over every visible GPU, in
        order, balanced by memory), else every weight on :attr:`device`."""
        return "auto" if self.requested.shards else {"": str(self.device)}

    def record(self) -> dict:
        """What a run folder records: the request and what it resolved to (``shard``: over how many GPUs)."""
        where = f"shard over {visible_gpu_count()} GPUs" if self.requested.shards else str(self.device)
        record = {"device": self.requested.device, "dtype": self.requested.dtype,
                  "resolved_device": where, "resolved_dtype": dtype_name(self.dtype)}
        if str(self.requested.dtype).strip().lower() == "auto" and self.device.type == "cpu":
            record["dtype_reason"] = auto_cpu_dtype()[1]
        return record


def resolve_placement(device: str = "auto", dtype: str = "auto") -> ResolvedPlacement:
    """``Placement(device, dtype).resolve()``: the first CUDA device in bf16 when present, else the CPU in
    bfloat16 where it computes it natively, else in float32."""
    return Placement(device, dtype).resolve()
