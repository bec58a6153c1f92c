"""Where a policy's misses come from: what it retrieved, or how it read it.

    python benchmarks/evidence.py --run v5=runs/pt/qwen-v5 --run search-r1=runs/pt/grpo-seq-11:sequential \
        [--data ../shared/data] [--out benchmarks/results/evidence]

Each ``--run NAME=DIR[:MODE]`` is a ``ps-agent eval`` output folder (as in ``paper_table.py``). For every question
of a set that has a corpus and gold passages (``DATA/SET/dev.jsonl`` with ``supporting_doc_ids``, beside
``DATA/SET/corpus.jsonl``), the passages its searches returned (the ids each eval line's timeline keeps) are
looked up in that corpus, and per set and question class the page gives:

- **gold passages found**: the share of the question's gold passages that any of its searches returned, and the
  share of questions with all of them;
- **answer retrieved**: the share of questions whose gold answer appears, as whole words after SQuAD
  normalisation, in a passage it retrieved (yes/no answers are left out: no passage spells them);
- **EM when retrieved**: of the questions whose answer it retrieved, the share it answered exactly;
- **retrieved, not answered**: of the questions counted for "answer retrieved", the share whose answer it
  retrieved and still missed: misses that reading, not retrieval, must fix. They are split three ways, by where the
  answer was: **quoted** (the last think turn wrote the answer down, then answered something else: a miss of
  picking the span), **last round, not quoted** (a passage of the last search round held it, the think turn quoted
  another sentence: a miss of picking the sentence), and **earlier round only** (only a passage of an earlier round
  held it: the chain went on past it). Of the quoted ones, those whose answer **nests** with a gold answer (one
  holds the other as whole words: ``Dunn`` for ``David Dunn``, ``Alachua County, Florida`` for ``Alachua``) missed
  only where the span ends, not which entity it names.
- **answered with a search query**: the share of those counted questions answered wrong with one of the queries
  the policy searched (or words of one, or a phrase holding one): a policy that names the entity it looked up
  last instead of what its passage says about it.

Writes ``OUT.md`` and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, Run, save
from ps_agent.episodes import scored
from ps_agent.metrics import cover_exact_match, mean
from ps_agent.questions import SHARED_DATA, yes_no
from training.plans import passages_by_id


def _timeline(record: dict[str, Any]) -> dict[str, Any]:
    """An eval line's turns and search rounds: none for a question whose run errored (it scores 0)."""
    return record.get("timeline") or {"turns": [], "search_rounds": []}


def retrieved_ids(record: dict[str, Any], rounds: slice = slice(None)) -> set[str]:
    """The passage ids an eval line's searches returned (in ``rounds``: all of them by default)."""
    return {
        passage["id"]
        for round_ in _timeline(record)["search_rounds"][rounds]
        for result in round_["results"]
        for passage in result["passages"] or ()
    }


def last_think(record: dict[str, Any]) -> str:
    """The think text of an eval line's last model turn ('' without one)."""
    turns = _timeline(record)["turns"]
    completion = (turns[-1].get("completion") or "") if turns else ""
    return completion.split("</think>")[0] if "</think>" in completion else ""


def missed_where(record: dict[str, Any], texts: dict[str, str]) -> str:
    """Where the answer of a question retrieved and missed was: ``quoted`` (the last think turn wrote it down),
    ``last round`` (a passage of the last search round held it, not quoted), else ``earlier round``."""
    if cover_exact_match(last_think(record), record["golden_answers"]):
        return "quoted"
    last = " ".join(texts.get(i, "") for i in retrieved_ids(record, slice(-1, None)))
    return "last round" if cover_exact_match(last, record["golden_answers"]) else "earlier round"


def gold_of(folder: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """A set's gold passage ids per question (``dev.jsonl``) and its corpus texts by id (``corpus.jsonl``)."""
    support = {}
    for line in (folder / "dev.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("supporting_doc_ids"):
            support[str(row["id"])] = list(row["supporting_doc_ids"])
    return support, passages_by_id(folder / "corpus.jsonl")


def nests(answer: str | None, golden: list[str]) -> bool:
    """An answer and some gold answer hold one another as whole words, either way round (``Dunn``, ``David Dunn``)."""
    return bool(answer) and any(cover_exact_match(answer, [g]) or cover_exact_match(g, [answer]) for g in golden)


def searched_answer(record: dict[str, Any]) -> bool:
    """An eval line's answer names one of its search queries (as whole words, either way round)."""
    answer = record.get("answer")
    queries = [q for round_ in _timeline(record)["search_rounds"] for q in round_["sub_queries"]]
    return any(nests(answer, [q]) for q in queries)


def evidence(record: dict[str, Any], support: list[str], texts: dict[str, str]) -> dict[str, Any]:
    """One question: how many of its gold passages were returned, and whether its answer was in what was."""
    found = retrieved_ids(record)
    readable = yes_no(record["golden_answers"]) is None
    read = " ".join(texts.get(i, "") for i in found)
    retrieved = cover_exact_match(read, record["golden_answers"]) if readable else None
    em = scored(record, "em")
    missed = missed_where(record, texts) if retrieved and not em else None
    return {
        "support_found": sum(i in found for i in support) / len(support),
        "all_support": all(i in found for i in support),
        "answer_retrieved": retrieved,
        "em": em,
        "missed": missed,
        "span": missed == "quoted" and nests(record.get("answer"), record["golden_answers"]),
        "searched_answer": (not em and searched_answer(record)) if readable else None,
    }


#: The keys of the three parts of "retrieved, not answered" (``missed_where``).
MISSED = {"missed_quoted": "quoted", "missed_last_round": "last round", "missed_earlier_round": "earlier round"}


def summary(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-group shares, in percent (None where no question could count)."""
    readable = [x for x in items if x["answer_retrieved"] is not None]
    retrieved = [x for x in readable if x["answer_retrieved"]]

    def percent(values: Iterable[float]) -> float | None:
        share = mean([float(v) for v in values])
        return None if share is None else 100 * share

    return {
        "n": len(items),
        "em": percent(x["em"] for x in items),
        "support_found": percent(x["support_found"] for x in items),
        "all_support": percent(x["all_support"] for x in items),
        "readable": len(readable),
        "answer_retrieved": percent(x["answer_retrieved"] for x in readable),
        "em_when_retrieved": percent(x["em"] for x in retrieved),
        "retrieved_not_answered": percent(bool(x["answer_retrieved"]) and not x["em"] for x in readable),
        **{key: percent(x["missed"] == where for x in readable) for key, where in MISSED.items()},
        "missed_quoted_span": percent(x["span"] for x in readable),
        "wrong_searched_answer": percent(x["searched_answer"] for x in readable),
    }


def table(runs: list[Run], data: Path) -> list[dict[str, Any]]:
    """One row per run, set and question class (and ``all``) over the sets with gold passages."""
    gold: dict[str, tuple[dict[str, list[str]], dict[str, str]] | None] = {}
    rows = []
    for run in runs:
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for record in run.records():
            dataset = record["dataset"]
            if dataset not in gold:
                folder = data / dataset
                has = (folder / "dev.jsonl").is_file() and (folder / "corpus.jsonl").is_file()
                gold[dataset] = gold_of(folder) if has else None
                if not has:
                    print(f"{dataset}: no dev.jsonl and corpus.jsonl under {folder}; left out", file=sys.stderr)
            if gold[dataset] is None or str(record["id"]) not in gold[dataset][0]:
                continue
            support, texts = gold[dataset]
            item = evidence(record, support[str(record["id"])], texts)
            groups.setdefault((dataset, "all"), []).append(item)
            groups.setdefault((dataset, record["question_class"]), []).append(item)
        rows += [
            {"run": run.name, "dataset": d, "class": c} | summary(items) for (d, c), items in sorted(groups.items())
        ]
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    def cell(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    head = (
        "| run | set | class | n | EM % | gold passages found % | all found % | answer retrieved % (of n) "
        "| EM when retrieved % | retrieved, not answered % | of which quoted % | (quoted, the answer nests) % "
        "| last round, not quoted % | earlier round only % | wrong, answered with a search query % |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['run']} | {r['dataset']} | {r['class']} | {r['n']} | {cell(r['em'])} | {cell(r['support_found'])} "
        f"| {cell(r['all_support'])} | {cell(r['answer_retrieved'])} ({r['readable']}) "
        f"| {cell(r['em_when_retrieved'])} | {cell(r['retrieved_not_answered'])} | {cell(r['missed_quoted'])} "
        f"| {cell(r['missed_quoted_span'])} | {cell(r['missed_last_round'])} | {cell(r['missed_earlier_round'])} "
        f"| {cell(r['wrong_searched_answer'])} |"
        for r in rows
    ]
    return (
        f"# Retrieval or reading: where the misses come from\n\n`{command}`\n\n"
        "Answer retrieved: the gold answer appears in a passage the searches returned (yes/no answers left out; "
        "the questions left are counted in brackets). Retrieved, not answered: the share of those counted "
        "questions whose answer was retrieved and still answered wrong, a miss of reading, not retrieval; it is the "
        "sum of the next three: the last think turn quoted the answer and answered something else; a passage of the "
        "last search round held it and the think turn quoted another sentence; only an earlier round held it. "
        "The answer nests: of the quoted ones, those whose answer and a gold answer hold one another as whole "
        "words (`Dunn` for `David Dunn`), a miss of where the span ends, not of which entity it names. "
        "Answered with a search query: of the same counted questions, the share answered wrong with (words of) a "
        "query the policy searched.\n\n" + head + "\n".join(lines) + "\n"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=DIR[:MODE], repeatable")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the folder of SET/dev.jsonl and corpus.jsonl")
    parser.add_argument("--out", type=Path, default=RESULTS / "evidence")
    args = parser.parse_args(argv)
    try:
        runs = [Run.parse(text) for text in args.run]
        rows = table(runs, args.data)
    except ValueError as exc:
        parser.error(str(exc))
    if not rows:
        parser.error(f"no question of these runs has gold passages under {args.data}")
    command = "python benchmarks/evidence.py " + " ".join(sys.argv[1:] if argv is None else argv)
    page = markdown(rows, command)
    save(args.out, {"command": command, "rows": rows}, page)
    print(page)
    return rows


if __name__ == "__main__":
    main()
