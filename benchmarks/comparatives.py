"""Quantity comparisons asked both ways: does a policy pick the direction its question asks for?

Each pair of entities gets a two-passage corpus, each passage stating one value ("K2, at 8,611 metres ..."), and
four questions: the larger and the smaller asked for, each with the names in both orders. The passages hold the
answer, so a policy that reads and compares answers all four; one that copies a name or misreads the adjective
("taller" as "the shortest") does not. The validation parts, mostly dates, ask few such questions.

    python benchmarks/comparatives.py --policy qwen-sft=qwen0.5b-parallelsearch

Writes ``benchmarks/results/comparatives.{json,md}``: per policy, right answers by direction, and each question with
the answer and the extreme its verdict named ("The question asks for the largest").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import EVAL_RUN_TIMEOUT_S, RESULTS, parse_policy, save  # noqa: E402
from ps_agent.metrics import exact_match  # noqa: E402

#: (question asking for the larger value, question asking for the smaller, then per entity: title, the other
#: names an answer may use, and the passage that states its value)
PAIRS: list[tuple[str, str, tuple[str, list[str], str], tuple[str, list[str], str]]] = [
    ("Which mountain is taller, {a} or {b}?", "Which mountain is lower, {a} or {b}?",
     ("Mount Everest", ["Everest"], "Mount Everest is Earth's highest mountain above sea level, at 8,849 metres."),
     ("K2", [], "K2, at 8,611 metres above sea level, is the second-highest mountain on Earth.")),
    ("Which river is longer, {a} or {b}?", "Which river is shorter, {a} or {b}?",
     ("Nile", ["the Nile", "Nile River"], "The Nile is a river in Africa, about 6,650 km long."),
     ("Amazon River", ["Amazon", "the Amazon"], "The Amazon River in South America is about 6,400 km long.")),
    ("Which city has more inhabitants, {a} or {b}?", "Which city has fewer inhabitants, {a} or {b}?",
     ("Marseille", [], "Marseille is a port city in France with a population of 873,076."),
     ("Lyon", [], "Lyon is a city in France with a population of 522,250.")),
    ("Which lake is deeper, {a} or {b}?", "Which lake is shallower, {a} or {b}?",
     ("Lake Baikal", ["Baikal"], "Lake Baikal is a rift lake in Siberia, with a maximum depth of 1,642 metres."),
     ("Lake Tanganyika", ["Tanganyika"], "Lake Tanganyika, in Africa, has a maximum depth of 1,470 metres.")),
    ("Which building is taller, {a} or {b}?", "Which building is shorter, {a} or {b}?",
     ("Burj Khalifa", [], "The Burj Khalifa is a skyscraper in Dubai, 828 metres tall."),
     ("Shanghai Tower", [], "The Shanghai Tower is a skyscraper in Shanghai, 632 metres tall.")),
    ("Which ocean is larger, {a} or {b}?", "Which ocean is smaller, {a} or {b}?",
     ("Pacific Ocean", ["Pacific", "the Pacific"], "The Pacific Ocean covers 165,250,000 square kilometres."),
     ("Atlantic Ocean", ["Atlantic", "the Atlantic"], "The Atlantic Ocean covers 106,460,000 square kilometres.")),
    ("Which planet is bigger, {a} or {b}?", "Which planet is smaller, {a} or {b}?",
     ("Jupiter", [], "Jupiter is the largest planet of the Solar System, with a diameter of 139,820 km."),
     ("Saturn", [], "Saturn is a gas giant with a diameter of 116,460 km.")),
    ("Which country has more people, {a} or {b}?", "Which country has fewer people, {a} or {b}?",
     ("Germany", [], "Germany is a country in Central Europe with a population of 83,200,000."),
     ("Poland", [], "Poland is a country in Central Europe with a population of 36,800,000.")),
    ("Which tower is taller, {a} or {b}?", "Which tower is shorter, {a} or {b}?",
     ("Eiffel Tower", ["the Eiffel Tower"], "The Eiffel Tower is a lattice tower in Paris, 330 metres tall."),
     ("Blackpool Tower", ["the Blackpool Tower"], "The Blackpool Tower is a tower in England, 158 metres tall.")),
    ("Which composer was born later, {a} or {b}?", "Which composer was born earlier, {a} or {b}?",
     ("Wolfgang Amadeus Mozart", ["Mozart"], "Wolfgang Amadeus Mozart was a composer born on 27 January 1756."),
     ("Johann Sebastian Bach", ["Bach"], "Johann Sebastian Bach was a composer born on 31 March 1685 in Eisenach.")),
]  # fmt: skip


def cases() -> list[dict[str, Any]]:
    """Four questions per pair (the first entity of each pair holds the larger value): the larger and the smaller
    asked for, each with the names in both orders."""
    out = []
    for p, (larger, smaller, big, small) in enumerate(PAIRS):
        corpus = [
            {"id": f"{p}-{i}", "contents": f'"{title}"\n{text}'} for i, (title, _, text) in enumerate((big, small))
        ]
        for wanted, template, (title, aliases, _) in (("largest", larger, big), ("smallest", smaller, small)):
            for a, b in ((big[0], small[0]), (small[0], big[0])):
                question = template.format(a=a, b=b)
                out.append({"pair": p, "question": question, "wanted": wanted, "answers": [title, *aliases],
                            "corpus": corpus})  # fmt: skip
    return out


def verdict_named(response: str) -> str | None:
    """The extreme a think turn says the question asks for (``The question asks for the largest``), if any."""
    found = re.search(r"The question asks for the (\w+)", response)
    return found.group(1) if found else None


async def run_policy(spec: str, mode: str, questions: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    from ps_agent import ParallelSearchAgent
    from ps_agent.llms import resolve_text_policy

    resolve_text_policy(spec).expected = len(questions)  # one loaded policy per spec: every turn in one batch
    corpora = {}  # one corpus file per pair, shared by its four questions
    for case in questions:
        if case["pair"] not in corpora:
            corpora[case["pair"]] = work / f"corpus-{case['pair']}.jsonl"
            corpora[case["pair"]].write_text("".join(json.dumps(line) + "\n" for line in case["corpus"]))
    agents = [
        ParallelSearchAgent(
            llm=spec, retriever=str(corpora[case["pair"]]), topk=1, mode=mode, run_timeout_s=EVAL_RUN_TIMEOUT_S
        )
        for case in questions
    ]
    outs = await asyncio.gather(
        *(agent.ainvoke(case["question"]) for agent, case in zip(agents, questions, strict=True))
    )
    return [
        {"question": case["question"], "wanted": case["wanted"], "answer": out["answer"],
         "right": bool(exact_match(out["answer"], case["answers"])),
         "verdict": verdict_named(out["trajectory"]["response"]), "llm_calls": out["stats"]["llm_calls"]}
        for case, out in zip(questions, outs, strict=True)
    ]  # fmt: skip


def markdown(command: str, results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [f"`{command}`", "", "| policy | right | asked for the larger | asked for the smaller | verdict named |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, rows in results.items():
        by = {w: [r for r in rows if r["wanted"] == w] for w in ("largest", "smallest")}
        named = sum(r["verdict"] is not None for r in rows)
        lines.append(
            f"| {name} | {sum(r['right'] for r in rows)} of {len(rows)} | "
            + " | ".join(f"{sum(r['right'] for r in by[w])} of {len(by[w])}" for w in by)
            + f" | {named} of {len(rows)} |"
        )
    for name, rows in results.items():
        lines += ["", f"## {name}", "", "| question | asked for | answer | right | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {r['question']} | {r['wanted']} | {r['answer']} | {'yes' if r['right'] else 'no'} | "
                  f"{r['verdict'] or '–'} |" for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from ps_agent.llms import release_text_policies

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", required=True, help="NAME=SPEC[:MODE] (parallel), repeatable")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "comparatives")
    parser.add_argument("--out", type=Path, default=RESULTS / "comparatives")
    args = parser.parse_args()
    questions = cases()
    args.work.mkdir(parents=True, exist_ok=True)
    policies = [parse_policy(item, default_mode="parallel") for item in args.policy]  # all, before the first runs
    results = {}
    for name, spec, mode in policies:
        results[name] = asyncio.run(run_policy(spec, mode, questions, args.work))
        release_text_policies()  # one loaded policy at a time: three 0.5B policies at once exceed 24 GB
        print(f"{name}: {sum(r['right'] for r in results[name])} of {len(questions)} right", flush=True)
    command = "python benchmarks/comparatives.py " + " ".join(sys.argv[1:])
    save(args.out, {"command": command, "results": results}, markdown(command, results))


if __name__ == "__main__":
    main()
