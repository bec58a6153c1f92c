"""Reporting an evaluation: read ``OUT/results``, aggregate it, and write the tables, plots and page.

``read_results`` takes each question's latest line; ``summarise_results`` aggregates per dataset × mode and per
dataset × question class × mode (``episodes.aggregate``, as the benchmarks' tables); ``report`` writes ``summary.json``,
``report.md`` (the paper's layouts), ``plots.png`` and ``report.html`` (``ps-agent report OUT`` rebuilds the page).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ps_agent.episodes import aggregate, question_fields, scores
from ps_agent.metrics import mean
from ps_agent.questions import DATASET_TYPES, QUESTION_CLASSES
from ps_agent.report import eval_rows, png_data_uri, render, save_png
from ps_agent.trajectories import read_records

logger = logging.getLogger(__name__)


#: what every result line holds (``eval.eval_record``), and what an answered one adds that the report reads
RESULT_KEYS = ("id", "dataset", "mode", "question", "question_class", "golden_answers", "error")
NUMBERS = (
    "em",
    "f1",
    "cover_em",
    "llm_calls",
    "search_rounds",
    "latency_s",
    "format_valid",
    "forced_answer",
    "decomposed",
)


def _readable(record: dict[str, Any], complete: bool) -> bool:
    """An errored line needs its reason; an answered one an EM, and, for the report (``complete``), every number
    it aggregates. A number present must be a number."""
    names = [record[key] for key in ("id", "dataset", "mode", "question_class")]
    if not all(isinstance(name, str) for name in names):
        logger.warning("skipping a result line whose id, dataset, mode or question_class is not text: %.120r", names)
        return False
    if record["error"] is not None:
        return isinstance(record["error"], str)
    needed = NUMBERS if complete else ("em",)
    numbers = {key: record.get(key) for key in NUMBERS if key in record or key in needed}
    if complete:
        rewards = record.get("rewards")
        numbers["rewards.total"] = rewards.get("total") if isinstance(rewards, dict) else None
    if all(isinstance(n, (int, float)) and math.isfinite(n) for n in numbers.values()):
        return True
    logger.warning("skipping the result of %s/%s (%s): expected numbers for %s", record["dataset"], record["id"],
                   record["mode"], ", ".join(numbers))  # fmt: skip
    return False


def read_results(out_dir: Path, complete: bool = False) -> list[dict[str, Any]]:
    """The latest line of each question per dataset and mode: a retried question's line follows its error's.
    A line that cannot be read (with every number the report aggregates, when ``complete``) is skipped with a
    warning that names it."""
    records = read_records(sorted((out_dir / "results").glob("*.jsonl")), required=RESULT_KEYS)
    latest = {(r["dataset"], r["mode"], r["id"]): r for r in records if _readable(r, complete)}
    return [rescored(r) for r in latest.values()]


def rescored(record: dict[str, Any]) -> dict[str, Any]:
    """A result line under today's metrics and question classes: its scores computed again from its answer and
    golds, and the type its dataset gives where it had none (``questions.DATASET_TYPES``). A line written before
    a metric was fixed is tabled as a new one would be, not with the score it was written with."""
    record = dict(record)
    if record.get("question_type") is None and record.get("dataset") in DATASET_TYPES:
        record |= question_fields(record | {"question_type": DATASET_TYPES[record["dataset"]]})
    if record.get("error") is None and isinstance(record.get("answer"), str):
        record |= scores(record["answer"], record["golden_answers"])
    return record


def summarise_results(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per dataset × mode, and per dataset × class × mode."""
    datasets = sorted({r["dataset"] for r in records})
    modes = sorted({r["mode"] for r in records})
    summary: dict[str, Any] = {"by_dataset": {}, "by_class": {}}
    for d in datasets:
        summary["by_dataset"][d] = {
            m: aggregate([r for r in records if r["dataset"] == d and r["mode"] == m]) for m in modes
        }
        for c in QUESTION_CLASSES:
            of_class = [r for r in records if r["dataset"] == d and r["question_class"] == c]
            if of_class:
                summary["by_class"][f"{d}/{c}"] = {m: aggregate([r for r in of_class if r["mode"] == m]) for m in modes}
    summary["overall"] = {m: aggregate([r for r in records if r["mode"] == m]) for m in modes}
    return summary


def cell(value: Any, digits: int = 1) -> str:
    """A table cell: ``value`` to ``digits`` decimals, or "–" where there is nothing to show."""
    return "–" if value is None else f"{value:.{digits}f}"


def em_row(name: str, ems: Sequence[float | None]) -> list[str]:
    """A row of the paper's Table 2 layout: ``name``, EM per benchmark ("–" where it has none) and their average,
    "–" unless every benchmark has one (an average over fewer benchmarks would not compare with the other rows)."""
    average = None if any(e is None for e in ems) else mean(ems)
    return [name, *(cell(e) for e in ems), cell(average)]


def em_table(summary: dict[str, Any]) -> dict[str, Any]:
    """EM per benchmark and mode, with the average over benchmarks (the paper's Table 2 layout)."""
    modes, datasets = sorted(summary["overall"]), list(summary["by_dataset"])
    rows = [em_row(m, [summary["by_dataset"][d][m].get("em") for d in datasets]) for m in modes]
    return {"caption": "Exact match (%) per benchmark", "header": ["mode", *datasets, "average"], "rows": rows}


def class_table(summary: dict[str, Any]) -> dict[str, Any]:
    """Per dataset and question class, the modes side by side: EM, decomposition, seconds, turns (Table 3)."""
    modes = sorted(summary["overall"])
    metrics = {"em": "EM", "decomposition_ratio": "decomp. %", "seconds_per_question": "s/question", "turns": "turns"}
    # each mode's own count of questions and of errors: an interrupted mode may have answered fewer
    header = ["dataset / class", *(f"n ({m})" for m in modes)]
    header += [*(f"{name} ({m})" for name in metrics.values() for m in modes), *(f"errors ({m})" for m in modes)]
    rows = []
    for key, by_mode in summary["by_class"].items():
        digits = {k: 2 if k in ("seconds_per_question", "turns") else 1 for k in metrics}
        cells = [cell(by_mode.get(m, {}).get(k), digits[k]) for k in metrics for m in modes]
        counts = [str(by_mode[m]["n"]) if m in by_mode else "0" for m in modes]
        errors = [str(by_mode[m]["errors"]) if m in by_mode else "0" for m in modes]
        rows.append([key, *counts, *cells, *errors])
    return {"caption": "Per question class: " + " vs ".join(modes), "header": header, "rows": rows}


def markdown(summary: dict[str, Any], problems: list[str]) -> str:
    """The paper's layouts: EM per benchmark and mode; per class, parallel vs sequential side by side."""
    lines = ["# Evaluation"]
    for table in (em_table(summary), class_table(summary)):
        lines += ["", f"## {table['caption']}", "", "| " + " | ".join(table["header"]) + " |"]
        lines.append("|---" * len(table["header"]) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
    if problems:
        lines += ["", f"## Skipped data lines ({len(problems)})", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any]) -> Any:
    """Turns and EM by question class and mode (a matplotlib figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(summary["by_class"])
    modes = sorted(summary["overall"])
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(keys) + 4), 4.5))
    width = 0.8 / max(1, len(modes))
    for ax, metric, title in ((axes[0], "turns", "LLM calls per question"), (axes[1], "em", "exact match (%)")):
        for i, m in enumerate(modes):
            values = [summary["by_class"][k][m].get(metric) or 0 for k in keys]
            ax.bar([x + i * width for x in range(len(keys))], values, width, label=m)
        ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(keys))], keys, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    return fig


def html_report(out_dir: str | Path, records: list[dict[str, Any]] | None = None) -> Path:
    """Write ``report.html``: the tables and plot of ``report.md`` and every question's trajectory, the modes
    of a question side by side (``ps-agent report OUT`` rebuilds it)."""
    out_dir = Path(out_dir)
    records = read_results(out_dir, complete=True) if records is None else records
    if not records:
        raise ValueError(f"{out_dir / 'results'} holds no result line the report can read (each skipped one is logged)")
    summary = summarise_results(records)
    path = out_dir / "report.html"
    page = render(
        kind="eval",
        title=f"Evaluation · {out_dir.resolve().name}",
        tables=[em_table(summary), class_table(summary)],
        plots=[png_data_uri(plot(summary))] if summary["by_class"] else [],
        rows=eval_rows(records),
        filters=["dataset", "mode", "class"],
    )
    path.write_text(page, encoding="utf-8")
    return path


def report(out_dir: str | Path, problems: list[str] | None = None) -> dict[str, Any]:
    """Aggregate ``OUT/results`` into ``summary.json``, ``report.md``, ``plots.png`` and ``report.html``;
    ``problems``: the data lines the eval skipped (None: those the last summary recorded, as ``ps-agent report``
    rebuilds it from the results alone)."""
    out_dir = Path(out_dir)
    records = read_results(out_dir, complete=True)
    if not records:
        raise ValueError(f"{out_dir / 'results'} holds no result line the report can read (each skipped one is logged)")
    if problems is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            problems = json.loads((out_dir / "summary.json").read_text()).get("skipped_lines")
    problems = [str(p) for p in problems] if isinstance(problems, list) else []
    summary = summarise_results(records)
    summary["skipped_lines"] = problems
    summary["runs"] = read_records([out_dir / "runs.jsonl"]) if (out_dir / "runs.jsonl").is_file() else []
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / "report.md").write_text(markdown(summary, problems))
    if summary["by_class"]:
        save_png(plot(summary), out_dir / "plots.png")
    html_report(out_dir, records)
    return summary
