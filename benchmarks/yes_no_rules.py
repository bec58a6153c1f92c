"""How often the gold's yes/no reading agrees with the real answers, and how often the gold answers each way.

A yes/no comparison asks either whether two things are the same ("Do X and Y have the same nationality?") or
whether both have a property ("Are X and Y both magazines?"). Where the findings are quoted lead sentences, the
gold's answer turn reads them (``training.turns.read_yes_no``): the country each names, or whether each holds every
content word of the property ("not stated" where one does not). With ``--checked-yes-no`` the gold keeps a real
question only where that reading gives its answer, so the policy learns the reading as a rule. This counts, for
each shared set's train and validation parts, what the reading says against the real answer, beside how the gold's
other sources answer the same forms: the synthetic worlds (half yes, half no, by a value their passages state) and
the pairs over real leads (``gold.py --pairs``, kinds ``occupation``, "no" where a lead does not state it, and
``nationality``).

Each ``--run NAME=DIR[:MODE]`` (a ``ps-agent eval`` folder, as in ``paper_table.py``) adds what that policy
answered to the real yes/no questions it was asked, by real answer and by the check its answer turn spelt out
(``check_kind``): the real questions' reading (``not stated``), the synthetic worlds' check of the value asked
(``The question asks whether both are "magazine". … : not both.``), a "the same" check, or none.

    python benchmarks/yes_no_rules.py [--seeds 101 102 103 104] [--pairs 60] [--run NAME=DIR ...] \
        [--out benchmarks/results/yes_no_rules]

Decide on the train rows; the validation rows are there to report, not to tune on. Writes ``OUT.md`` and
``OUT.json``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, Run, save  # noqa: E402
from ps_agent.questions import SHARED_DATA, yes_no  # noqa: E402
from training.pairs import paired_questions  # noqa: E402
from training.plans import WORLD_ENTITIES, WORLD_PER_FAMILY, GoldQuestion, shared_questions, synthetic_questions  # noqa: E402
from training.reading import asks_same  # noqa: E402
from training.turns import read_yes_no  # noqa: E402

#: the sets whose parts carry gold passages to read
SETS = ("hotpotqa", "2wikimultihopqa")


def form(question: str) -> str:
    """``same`` for a question asking whether two things are the same, else ``both`` (a shared property)."""
    return "same" if asks_same(question) else "both"


def by_form(cells: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """``(question, cell)`` pairs counted per form (``both``, ``same``), each form's cells sorted."""
    counts: dict[str, Counter] = {"both": Counter(), "same": Counter()}
    for question, cell in cells:
        counts[form(question)][cell] += 1
    return {name: dict(sorted(c.items())) for name, c in counts.items()}


def tally(questions: Iterable[GoldQuestion], read: bool = True) -> dict[str, dict[str, int]]:
    """Per form, the yes/no questions by real answer and by what the reading of their last round says
    (``yes``, ``no``, or ``undecided`` where it reads nothing); ``read`` False counts the answers alone."""

    def cell(q: GoldQuestion, answer: str) -> str:
        if not read:
            return answer
        verdict = read_yes_no(q.question, q.plan[-1]) if len(q.plan[-1]) == 2 else None
        return f"{answer}, read {'undecided' if verdict is None else 'yes' if verdict[1] else 'no'}"

    return by_form((q.question, cell(q, a)) for q in questions if (a := yes_no(q.golden_answers)))


def agreement(cells: dict[str, int]) -> dict[str, Any]:
    """How a form's questions split: answered yes; decided by the reading, and of those the share it gets right;
    and the share "always yes" gets right over the same decided questions."""
    decided = {k: v for k, v in cells.items() if not k.endswith("undecided")}
    n = sum(decided.values())
    right = sum(v for k, v in decided.items() if k in ("yes, read yes", "no, read no"))
    yes = sum(v for k, v in decided.items() if k.startswith("yes"))
    return {
        "questions": sum(cells.values()),
        "answered yes": sum(v for k, v in cells.items() if k.startswith("yes")),
        "decided by the reading": n,
        "reading right": right,
        "always yes right": yes,
    }


def check_kind(turn: str) -> str:
    """Which check an answer turn spelt out before a yes/no answer: ``reading`` (the real questions' "not stated"
    or "yes" per name), ``value`` (the synthetic worlds' ``The question asks whether both are "X"``), ``same``
    (whether two values are the same, a country's included), or ``none``."""
    if re.search(r'The question asks whether both are "', turn):
        return "value"
    if re.search(r"The question asks whether they are (from )?the same", turn):
        return "same"
    if re.search(r"The question asks whether both .*: (yes|not stated)[;.]", turn):
        return "reading"
    return "none"


def answered(run: Run) -> dict[str, dict[str, int]]:
    """Per form, a run's real yes/no questions by real answer, its answer and the check it spelt out."""

    def cell(record: dict[str, Any], gold: str) -> str:
        turns = (record.get("timeline") or {}).get("turns") or [{}]
        said = (record.get("answer") or "").strip().lower()
        said = said if said in ("yes", "no") else "other"
        return f"{gold}, answered {said}, {check_kind(turns[-1].get('completion', ''))}"

    return by_form((r["question"], cell(r, g)) for r in run.records() if (g := yes_no(r["golden_answers"])))


def measure(seeds: list[int], pairs: int, root: Path = SHARED_DATA) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name in SETS:
        for part in ("train", "validation"):
            cells = tally(shared_questions(name, part=part, root=root).questions)
            rows[f"{name} {part}"] = {f: {"cells": c, **agreement(c)} for f, c in cells.items()}
    with tempfile.TemporaryDirectory() as work:
        synthetic = synthetic_questions(seeds, WORLD_ENTITIES, WORLD_PER_FAMILY, Path(work)).questions
    consecutive = len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1))
    label = f"{seeds[0]}–{seeds[-1]}" if consecutive else ",".join(map(str, seeds))
    rows[f"synthetic worlds {label}"] = {
        f: {"cells": c, "questions": sum(c.values()), "answered yes": c.get("yes", 0)}
        for f, c in tally(synthetic, read=False).items()
    }
    for name in SETS if pairs else ():
        cells = tally(paired_questions(name, pairs, root=root, kinds=("occupation", "nationality")).questions)
        rows[f"{name} pairs ({pairs} a kind)"] = {f: {"cells": c, **agreement(c)} for f, c in cells.items()}
    return rows


def runs_page(runs: dict[str, Any]) -> str:
    lines = [
        "",
        "## What each policy answered, and with which check",
        "",
        "Per run and form: real answer, the policy's answer, and the check its answer turn spelt out (`reading`: "
        "the real questions' \"not stated\"; `value`: the synthetic worlds' `The question asks whether both are "
        '"X"`; `same`; `none`).',
        "",
        "| run | form | cells |",
        "|---|---|---|",
    ]
    for name, forms in runs.items():
        for form_name, cells in forms.items():
            lines.append(f"| {name} | {form_name} | {'; '.join(f'{k}: {v}' for k, v in cells.items()) or 'none'} |")
    return "\n".join(lines) + "\n"


def page(rows: dict[str, Any], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        "Real rows: each yes/no comparison of the part whose gold passages give a two-step last round, by its real "
        "answer and by what `read_yes_no` reads in the two leads. *Reading right* and *always yes right* count the "
        "questions the reading decides. Synthetic rows count the worlds' answers (their checks read the values "
        "their passages state). Decide on the train rows; the validation rows are reported, not tuned on.",
        "",
        "| source | form | questions | answered yes | decided by the reading | reading right | always yes right "
        "| cells |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for source, forms in rows.items():
        for name, row in forms.items():
            cells = "; ".join(f"{k}: {v}" for k, v in row["cells"].items()) or "none"
            values = [row.get(k, "") for k in ("questions", "answered yes", "decided by the reading")]
            values += [row.get(k, "") for k in ("reading right", "always yes right")]
            lines.append(f"| {source} | {name} | {' | '.join(map(str, values))} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103, 104], help="synthetic worlds")
    parser.add_argument("--pairs", type=int, default=60, help="pairs of each kind over real leads (0: none)")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared sets' folder")
    parser.add_argument("--run", action="append", default=[], help="NAME=DIR[:MODE], repeatable: an eval folder")
    parser.add_argument("--out", type=Path, default=RESULTS / "yes_no_rules")
    args = parser.parse_args(argv)
    if args.pairs < 0:
        parser.error(f"--pairs {args.pairs}: expected a count >= 0")
    try:
        runs = {run.name: answered(run) for run in map(Run.parse, args.run)}
    except ValueError as exc:
        parser.error(str(exc))
    command = ("python benchmarks/yes_no_rules.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    rows = measure(args.seeds, args.pairs, args.data)
    text = page(rows, command) + (runs_page(runs) if runs else "")
    save(args.out, {"command": command, "rows": rows, "runs": runs}, text)
    print(text)
    return {"rows": rows, "runs": runs}


if __name__ == "__main__":
    main()
