"""How a model is loaded: ``--device``, ``--dtype`` and, for a Hub id, ``--revision``.

:class:`LoadOptions` travels from the command line to every function that loads a model (search
workers included, so it is picklable). :meth:`LoadOptions.check` resolves everything that can fail
without loading weights (the device, the dtype, a Hub id in the cache) and returns what a run folder
records; the commands call it before they open their folder.
"""
from __future__ import annotations

from dataclasses import dataclass

from posbias.models.fingerprint import model_content
from posbias.models.hub import looks_like_hub_id, resolve_hub_model
from posbias.utils.devices import Placement, ResolvedPlacement, dtype_name


@dataclass(frozen=True)
class LoadOptions:
    """``device`` / ``dtype`` as the command line spells them; ``revision`` of a Hub id (None: main).

    The library default is the CPU in float32; the commands default to ``auto`` (see
    :mod:`posbias.utils.devices`).
    """

    device: str = "cpu"
    dtype: str = "float32"
    revision: str | None = None

    def placement(self) -> ResolvedPlacement:
        """The device and dtype on this machine (``ValueError`` of one line when it has none)."""
        return Placement(str(self.device), _spelled(self.dtype)).resolve()

    def check(self, spec: str) -> dict:
        """Resolve the placement and, for a Hub id, its snapshot; return the run folder's record:
        requested and resolved device / dtype, and the Hub id, revision and commit where there is one."""

        record = self.placement().record()
        if looks_like_hub_id(spec):
            record.update(resolve_hub_model(spec, self.revision).record())
        elif self.revision is not None:
            raise ValueError(f"--revision {self.revision} is for a Hugging Face Hub id; {spec!r} is not one")
        return record


def options_for(load: LoadOptions | None, loaded=None) -> LoadOptions | None:
    """``load``, or for a run given an already ``loaded=(model, tokenizer)`` without it, the device and
    dtype that model is on (so its run folder records where it really ran)."""
    if load is not None or loaded is None:
        return load
    param = next(loaded[0].parameters())
    return LoadOptions(str(param.device), dtype_name(param.dtype))


def _spelled(dtype) -> str:
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


def resume_dtype(record: dict) -> str:
    """The part of a load record that decides whether a run folder may be resumed: the resolved dtype
    (an ``auto`` run first on a CPU in float32 must not continue in bfloat16 on a GPU)."""
    return record["resolved_dtype"]


def load_settings(spec: str, load: LoadOptions | None) -> dict:
    """The settings a run folder's config gains from how its model loads: ``load`` (the record of
    :meth:`LoadOptions.check`), ``dtype`` (the resolved dtype, one of its resume keys) and ``model_content``
    (:func:`~posbias.models.fingerprint.model_content`, compared on every resume that recorded it)."""
    load = load or LoadOptions()
    record = load.check(spec)
    return {"dtype": resume_dtype(record), "load": record, "model_content": model_content(spec, load.revision)}
