"""Which quote of a chain's last passage a gold think turn could give: how often each rule holds the answer.

    python benchmarks/bridge_quotes.py [--part train] [--data ../shared/data] [--out benchmarks/results/bridge_quotes]

A gold episode of a bridge or compositional question quotes one sentence of its last hop's passage before it
answers. Today that is the sentence naming the answer (``training.reading.quote(contents, answer)``): the gold knows
it and the policy must find it. A rule the policy could follow from the question alone would quote the passage's
first sentence, or add the sentence that shares most of the question's words (``training.reading.quote_for``, as the
comparisons do), optionally without the words the earlier hops already read ("director", "film" in "Where was the
director of film X born?"). For the chains of each shared set's ``--part`` whose answer is not yes or no, this
counts how often each rule's quote holds the gold answer (SQuAD-normalised, whole words, as the eval reads it).
A rule that misses the answer would teach the policy to answer from a sentence without it. It also counts the
chains whose answer is the last hop's title itself, the entity the gold searched last: there the gold teaches the
policy to answer with what it searched, unless the answer turn checks it against the question (``title_check``),
which the last table counts.

Writes ``OUT.md`` and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, save
from ps_agent.metrics import cover_exact_match, exact_match
from ps_agent.questions import SHARED_DATA, yes_no
from training.plans import SHARED_SETS, GoldQuestion, passages_by_id, shared_questions
from training.reading import plain_title, quote, quote_for
from training.turns import title_check


def _spent(q: GoldQuestion) -> str:
    """What the chain's earlier hops searched and quoted: words the last hop's sentence need not share."""
    return " ".join(f"{s['sub_question']} {s.get('finding') or ''}" for r in q.plan[:-1] for s in r)


#: Each rule: the quote it takes from the last hop's passage, given the question.
RULES: dict[str, Callable[[str, GoldQuestion, dict[str, Any]], str]] = {
    "the sentence naming the answer (today's gold)": lambda text, q, step: quote(text, q.golden_answers[0]),
    "first sentence": lambda text, q, step: quote(text),
    "first + the sentence sharing most question words": lambda text, q, step: quote_for(
        text, q.question, step["sub_question"]
    ),
    "the same, without the earlier hops' words": lambda text, q, step: quote_for(
        text, q.question, f"{step['sub_question']} {_spent(q)}"
    ),
}


def rows_for(name: str, questions: list[GoldQuestion], passages: dict[str, str]) -> list[dict[str, Any]]:
    """One row per rule: of the set's chains (their answer not yes/no), how many quotes hold the answer."""
    chains = [q for q in questions if q.question_class == "sequential" and yes_no(q.golden_answers) is None]
    held = {rule: 0 for rule in RULES}
    in_passage = searched = checked = 0
    for q in chains:
        (step,) = q.plan[-1]
        text = passages[step["passage_id"]]
        in_passage += bool(cover_exact_match(text, q.golden_answers))
        searched += bool(exact_match(plain_title(step["sub_question"]), q.golden_answers))
        checked += title_check(q) is not None
        for rule, take in RULES.items():
            held[rule] += bool(cover_exact_match(take(text, q, step), q.golden_answers))
    return [
        {"set": name, "rule": rule, "n": len(chains), "in_passage": in_passage, "held": held[rule],
         "answer_searched": searched, "answer_checked": checked}
        for rule in RULES
    ]  # fmt: skip


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    rows = [r for r in rows if r["n"]]
    quotes = "\n".join(
        f"| {r['set']} | {r['rule']} | {r['n']} | {r['in_passage']} | {r['held']} | {100 * r['held'] / r['n']:.1f} |"
        for r in rows
    )
    searched = "\n".join(
        f"| {r['set']} | {r['n']} | {r['answer_searched']} | {100 * r['answer_searched'] / r['n']:.1f} | "
        f"{r['answer_checked']} |"
        for r in rows
        if r["rule"] == next(iter(RULES))
    )
    return (
        f"# Bridge quotes: how often a rule's quote of the last hop holds the answer\n\n`{command}`\n\n"
        "Chains: the part's bridge, compositional and multi-hop questions with a gold plan whose answer is not yes "
        "or no. A quote is clipped as the gold clips it (24 words).\n\n"
        "| set | rule | chains | answer in the last passage | quote holds the answer | % of chains |\n"
        f"|---|---|---|---|---|---|\n{quotes}\n\n"
        "Chains whose answer is the last hop's title, the entity the gold searched last, and those whose answer turn "
        "checks it against the question (`training.turns.title_check`: a phrase of the question the quote holds):\n\n"
        "| set | chains | answered with the last hop's title | % | checked |\n|---|---|---|---|---|\n"
        f"{searched}\n"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("train", "validation"), default="train")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the folder of SET/dev.jsonl and corpus.jsonl")
    parser.add_argument("--sets", default=",".join(SHARED_SETS), help="comma-separated shared sets")
    parser.add_argument("--out", type=Path, default=RESULTS / "bridge_quotes")
    args = parser.parse_args(argv)
    rows = []
    for name in args.sets.split(","):
        gold = shared_questions(name, args.part, args.data)
        for reason, count in gold.skipped.items():
            print(f"{reason}: {count} left out", file=sys.stderr)
        if gold.questions:
            rows += rows_for(name, gold.questions, passages_by_id(Path(gold.questions[0].corpus)))
    if not any(r["n"] for r in rows):
        parser.error(f"no chain with a gold plan in {args.sets} under {args.data}")
    command = "python benchmarks/bridge_quotes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    page = markdown(rows, command)
    save(args.out, {"command": command, "rows": rows}, page)
    print(page)
    return rows


if __name__ == "__main__":
    main()
