"""Length-extrapolation benchmark (BAM paper, small scale): a thin wrapper over ``posbias study``.

    python benchmarks/extrapolation.py --preset tiny --out runs/study --train-steps 2000 --n 2
    python benchmarks/extrapolation.py --preset 120m --corpus /data/corpus.jsonl \\
        --out runs/study-120m --train-steps 20000 --n 20 --niah      # GPU node

Takes exactly the options of ``posbias study --help`` (see ``posbias.study.runner``).
"""
from __future__ import annotations

import typer

from posbias.cli.common import friendly_errors
from posbias.cli.study_cmd import study_command


def main() -> None:
    typer.run(friendly_errors(study_command))


if __name__ == "__main__":
    main()
