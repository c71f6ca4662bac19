"""BAM pre-training: data packing (:mod:`.data`), settings (:mod:`.config`), optimizer and schedule
(:mod:`.schedule`), checkpoints (:mod:`.checkpoint`), the metrics log (:mod:`.step_log`), the loop
(:func:`train`, :mod:`.trainer`) and DDP helpers (:mod:`.distributed`)."""
from .data import PackedDataset, load_texts, load_tokenizer, paul_graham_dir, smollm2_tokenizer_dir
from .trainer import TrainConfig, lr_lambda, train

__all__ = ["TrainConfig", "train", "lr_lambda", "PackedDataset", "load_texts", "load_tokenizer", "paul_graham_dir",
           "smollm2_tokenizer_dir"]
