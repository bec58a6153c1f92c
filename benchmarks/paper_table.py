"""The paper's comparison tables for our models, with bootstrap confidence intervals (``benchmarks.common``).

    python benchmarks/paper_table.py --run base=runs/eval-base --run sft=runs/eval-sft \
        --run grpo=runs/eval-grpo --run search-r1=runs/eval-grpo-seq:sequential \
        --baseline search-r1 --ours grpo [--sets hotpotqa,2wikimultihopqa] [--bootstrap 2000] \
        [--out benchmarks/results/paper_table]

Each ``--run NAME=DIR[:MODE]`` is a ``ps-agent eval`` output folder and the mode whose lines stand for that model
(default ``parallel``; a Search-R1 baseline is read in ``sequential`` mode). Writes ``OUT.md``, ``OUT.json`` and
``figures/OUT.png`` beside them:

- Table 3 layout: per dataset and question class, for every model, EM, decomposition ratio %, seconds per
  question and turns (LLM calls), with 95% percentile bootstrap intervals on EM and turns (questions resampled);
- Table 2 layout: EM per benchmark and the average over benchmarks;
- Table 4 layout (one line per model, e.g. the arms of a reward-weight ablation): every question pooled over the
  datasets, EM overall and per question class, the decomposition ratio on parallelisable and on sequential
  questions and the turns on parallelisable ones, with intervals;
- ours vs the baseline on the questions both answered: the EM difference and the turns ratio, each with a paired
  bootstrap interval (the same resampled questions for both models).

``--sets`` keeps only those datasets' lines, so that the pooled rows are over them alone (the ship rule's 65 real
comparisons: ``--sets hotpotqa,2wikimultihopqa`` on runs evaluated on every set).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, Run, paper_tables


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=DIR[:MODE], repeatable")
    parser.add_argument("--ours", help="the run compared against --baseline question by question")
    parser.add_argument("--baseline", help="e.g. the Search-R1 baseline's run name")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sets", help="only these datasets, comma-separated, e.g. hotpotqa,2wikimultihopqa")
    parser.add_argument("--out", type=Path, default=RESULTS / "paper_table")
    args = parser.parse_args(argv)
    try:
        runs = [Run.parse(text) for text in args.run]
        sets = [name.strip() for name in args.sets.split(",") if name.strip()] if args.sets else None
        return paper_tables(runs, args.ours, args.baseline, args.bootstrap, args.out, args.seed, sets)
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
