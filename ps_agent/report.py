"""HTML reports: one self-contained ``report.html`` for an eval or a training run folder.

The page needs no network and works from ``file://``: the summary tables and plots are rendered here
(Jinja2, autoescaped), the records travel as one JSON block that the page's own script reads, filters and
pages through, and every untrusted string (questions, model text, titles) reaches the page through
``textContent``, never as markup.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from ps_agent.episodes import summarise_rollouts
from ps_agent.metrics import mean
from ps_agent.questions import QUESTION_CLASSES
from ps_agent.rewards import COMPONENTS
from ps_agent.trajectories import read_trajectories

_env = Environment(loader=PackageLoader("ps_agent", "templates"), autoescape=select_autoescape(default=True))


def script_json(data: Any) -> Markup:
    """JSON that can sit inside ``<script type="application/json">``: ``<``, ``>`` and ``&`` are escaped as
    ``\\u`` sequences, so no string in it (``</script>``, ``<!--``) can end the block."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def png_data_uri(figure: Any) -> str:
    """A matplotlib figure as an inline PNG (the page has no other files)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def save_png(figure: Any, path: Path) -> None:
    """Save a matplotlib figure as a PNG file and free it."""
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=110)
    plt.close(figure)


def timeline(record: dict[str, Any], steps: dict[str, Any]) -> dict[str, Any]:
    """What the page draws for one run: its turns and search rounds (``steps``: parallel branches), the
    answer, rewards and error."""
    return {
        "turns": steps.get("turns", []),
        "search_rounds": steps.get("search_rounds", []),
        "answer": record.get("answer"),
        "rewards": record.get("rewards"),
        "error": record.get("error"),
    }


def eval_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per question and mode, the fields the filters and the list read, plus its timeline."""
    return [
        {
            "key": f"{r['dataset']}/{r['id']}",
            "dataset": r["dataset"],
            "mode": r["mode"],
            "class": r["question_class"],
            "question": r["question"],
            "golden": r["golden_answers"],
            "correct": None if r["error"] else bool(r["em"]),
            "decomposed": None if r["error"] else bool(r["decomposed"]),
            "forced": None if r["error"] else bool(r["forced_answer"]),
            "llm_calls": r.get("llm_calls"),
            "latency_s": r.get("latency_s"),
            **timeline(r, r.get("timeline", {})),  # results written before timelines were kept have none
        }
        for r in sorted(records, key=lambda r: (r["dataset"], str(r["id"]), r["mode"]))
    ]


def training_curves(records: list[dict[str, Any]]) -> Any:
    """Reward components and decomposition by class, averaged per optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted({r["step"] for r in records})
    by_step = {s: [r for r in records if r["step"] == s] for s in steps}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in (*COMPONENTS, "total"):
        left.plot(steps, [mean([r["rewards"][name] for r in by_step[s]]) for s in steps], marker=".", label=name)
    left.set(title="reward components per step", xlabel="step")
    for cls in QUESTION_CLASSES:
        values = [mean([float(r["decomposed"]) for r in by_step[s] if r["question_class"] == cls]) for s in steps]
        if any(v is not None for v in values):
            right.plot(steps, [float("nan") if v is None else v for v in values], marker=".", label=cls)
    right.set(title="decomposed fraction by question class", xlabel="step", ylim=(-0.05, 1.05))
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def training_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per logged rollout, the latest first."""
    rows = [
        {
            "key": f"step {r['step']} · rollout {i}",
            "step": r["step"],
            "class": r["question_class"],
            "question": r["question"],
            "golden": r["golden_answers"],
            "correct": r["rewards"]["outcome"] > 0,
            "decomposed": bool(r["decomposed"]),
            "forced": bool(r["forced_answer"]),
            "llm_calls": r["llm_calls"],
            "latency_s": r["latency_s"],
            **timeline(r, r["timeline"]),
        }
        for i, r in enumerate(records)
    ]
    return rows[::-1]


def render(
    kind: str,
    title: str,
    tables: list[dict[str, Any]],
    plots: list[str],
    rows: list[dict[str, Any]],
    filters: list[str],
) -> str:
    """The page: ``tables`` (caption, header, rows) and ``plots`` (data URIs) rendered here, ``rows`` as data
    for the page's list, its ``filters`` and the timelines."""
    return _env.get_template("report.html.j2").render(
        kind=kind,
        title=title,
        tables=tables,
        plots=plots,
        filters=filters,
        data=script_json(rows),
        config=script_json({"kind": kind, "filters": filters}),
        nonce=secrets.token_urlsafe(16),  # the page's own script runs; any other <script> does not (CSP)
    )


def training_report(run_dir: str | Path) -> Path:
    """Write ``report.html`` into a training run folder (``trajectories*.jsonl``); returns its path."""
    run_dir = Path(run_dir)
    records = read_trajectories(run_dir)
    if not records:
        raise ValueError(f"no rollouts in {run_dir} (expected trajectories*.jsonl lines of a training run)")
    summary = summarise_rollouts(records)
    table = [[f"reward/{k}", f"{v:+.3f}"] for k, v in summary["rewards"].items()]
    table += [[k, f"{summary[k]:.3f}"] for k in ("format_valid", "forced_answer", "search_rounds")]
    table += [[f"decomposed/{c}", f"{v:.3f}"] for c, v in summary["decomposed_by_class"].items()]
    caption = f"{summary['rollouts']} rollouts over {summary['steps']} steps"
    path = run_dir / "report.html"
    page = render(
        kind="training",
        title=f"Training run · {run_dir.name}",
        tables=[{"caption": caption, "header": ["metric", "mean"], "rows": table}],
        plots=[png_data_uri(training_curves(records))],
        rows=training_rows(records),
        filters=["step", "class"],
    )
    path.write_text(page, encoding="utf-8")
    return path
