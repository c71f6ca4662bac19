"""Models posbias trains itself (``posbias train`` / ``study``: the BAM decoder, ``model_type`` ``posbias-bam``).

Their folders load through :func:`posbias.models.load_model` like any other model: the model type is
registered with transformers' Auto classes before the folder is read (:func:`register_folder_model_type`),
and the run folder itself stands for the model it trained (:func:`trained_model_folder`).
They carry their own positional scheme (GGD, ALiBi, NoPE, ... ; Chi et al. / Bai et al.'s BAM priors),
not a transformers rotary module, so the training-free methods that rescale RoPE (everything but ``none``)
are refused on them with one line (:func:`posbias.methods.registry.check_method_fits`).
"""
from __future__ import annotations

from pathlib import Path

import posbias.bam  # noqa: F401  (registers model_type "posbias-bam" with AutoConfig / AutoModelForCausalLM)
from posbias.architecture.layers import ModelLoadError
from posbias.bam.config import BamConfig
from posbias.utils.io import read_json

BAM_MODEL_TYPE = BamConfig.model_type


def config_doc(path: str | Path) -> dict:
    """``path/config.json`` as a dict ({} without a readable JSON object there)."""
    try:
        doc = read_json(Path(path) / "config.json")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def is_saved_model(path: str | Path) -> bool:
    """Whether ``path`` holds a saved model (a Hugging Face ``config.json`` with ``model_type``), not a
    training run folder (whose ``config.json`` is the run's settings)."""
    return "model_type" in config_doc(path)


def folder_model_type(path: str | Path) -> str | None:
    """The ``model_type`` in ``path/config.json`` (None without a readable one)."""
    return config_doc(path).get("model_type")


def register_folder_model_type(path: str | Path) -> bool:
    """Register the posbias model type a folder holds with the Auto classes; True for a trained BAM
    folder (whose models have no RoPE for :func:`posbias.models.check_rope_model` to check)."""
    if folder_model_type(path) != BAM_MODEL_TYPE:
        return False

    return True


def run_folder_kind(path: str | Path) -> str | None:
    """``"train"`` / ``"study"`` for a posbias run folder (its ``config.json`` is the run's settings), else None."""
    kind = config_doc(path).get("kind")
    return kind if kind in ("train", "study") else None


def trained_model_folder(path: str | Path) -> Path:
    """The model a ``posbias train`` / ``study`` output folder holds (``final/``; a study's one scheme's
    ``models/<scheme>/final``), or ``path`` itself when it is no such run folder. A run without a finished
    model, or a study of several schemes, is a :class:`ModelLoadError` saying what to pass instead."""
    path = Path(path)
    kind = run_folder_kind(path)
    if kind == "train":
        if not is_saved_model(path / "final"):
            raise ModelLoadError(f"{path} is a posbias train run without a final model yet (run the same train "
                                 "command again to resume it)")
        return path / "final"
    if kind == "study":
        models = sorted(p.parent for p in (path / "models").glob("*/final") if is_saved_model(p))
        if not models:
            raise ModelLoadError(f"{path} is a posbias study without a trained model yet (run the same study "
                                 "command again to resume it)")
        if len(models) > 1:
            raise ModelLoadError(f"{path} is a posbias study of {len(models)} trained models; give one of them "
                                 f"as --model ({', '.join(str(m) for m in models)})")
        return models[0] / "final"
    return path


def is_trained_model(model) -> bool:
    """Whether ``model`` is a posbias-trained BAM decoder."""
    return getattr(getattr(model, "config", None), "model_type", None) == BAM_MODEL_TYPE
