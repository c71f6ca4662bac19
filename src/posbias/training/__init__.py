"""BAM pre-training: data packing (:mod:`.data`), the loop (:func:`train`), DDP helpers."""
from .data import PackedDataset, load_texts, load_tokenizer, paul_graham_dir, smollm2_tokenizer_dir
from .trainer import TrainConfig, lr_lambda, train

__all__ = ["TrainConfig", "train", "lr_lambda", "PackedDataset", "load_texts", "load_tokenizer", "paul_graham_dir",
           "smollm2_tokenizer_dir"]
