"""The length-extrapolation study of the BAM paper at small scale.

    from posbias.study import StudyConfig, run_study
    run_study(StudyConfig(out="runs/study", preset="tiny", train_steps=2000))

Modules: ``grid`` (schemes, lengths, per-model evaluation), ``runner`` (train + evaluate + report),
``plots`` (heatmaps, accuracy / perplexity against length), ``priors`` (learned GGD priors,
attention maps). The command is ``posbias study`` (``posbias.cli.study_cmd``).
"""
from posbias.study.grid import (
                                DEFAULT_DEPTHS,
                                DEFAULT_MULTIPLIERS,
                                DEFAULT_SCHEMES,
                                evaluate_model,
                                grid_lengths,
                                parse_scheme,
                                parse_schemes,
)
from posbias.study.runner import StudyConfig, run_study, write_report

__all__ = ["DEFAULT_DEPTHS", "DEFAULT_MULTIPLIERS", "DEFAULT_SCHEMES", "StudyConfig", "evaluate_model",
           "grid_lengths", "parse_scheme", "parse_schemes", "run_study", "write_report"]
