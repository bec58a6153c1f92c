"""Plain questions over the embedded corpus whose lead summaries hold the facts: what `ps-agent ask` is asked.

Ten comparisons (dates, lengths, heights, populations; asked for the larger and for the smaller) and four 2-hop
questions, each with the summaries that state its facts (checked by ``tests/test_embedded_questions.py``). None is a
question of the issues or the README. Each policy answers each question with BM25 over the embedded summaries, with
its title field and without it (``title_weight=0``), so the table shows what retrieval changes for the same policy.

    python benchmarks/embedded_questions.py --policy qwen-sft=qwen0.5b-parallelsearch \
        --policy qwen-searchr1=qwen0.5b-searchr1:sequential

Writes ``benchmarks/results/embedded_questions.{json,md}``: per policy and retriever, right answers by kind, and
each question with its searches and answer.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import EVAL_RUN_TIMEOUT_S, RESULTS, parse_policy, save  # noqa: E402
from ps_agent.metrics import exact_match  # noqa: E402

#: kind, question, answers, and the facts it needs: (summary title, the words of that summary stating the fact)
QUESTIONS: list[dict[str, Any]] = [
    {"kind": "comparison", "question": "Which university was founded first, Harvard University or Yale University?",
     "answers": ["Harvard University", "Harvard"],
     "facts": [("Harvard University", "Founded in 1636"), ("Yale University", "Founded in 1701")]},
    {"kind": "comparison", "question": "Which river is longer, the Nile or the Yangtze?",
     "answers": ["Nile", "the Nile", "Nile River"],
     "facts": [("Nile", "7,088 kilometers"), ("Yangtze", "6,236 kilometers")]},
    {"kind": "comparison", "question": "Which mountain is higher, Mont Blanc or Mount Kilimanjaro?",
     "answers": ["Mount Kilimanjaro", "Kilimanjaro"],
     "facts": [("Mont Blanc", "4,807.3"), ("Mount Kilimanjaro", "5,895")]},
    {"kind": "comparison", "question": "Which city has a larger population, Rome or Cairo?",
     "answers": ["Cairo"],
     "facts": [("Rome", "2.7 million"), ("Cairo", "9.8 million")]},
    {"kind": "comparison", "question": "Which novel was published first, Pride and Prejudice or Don Quixote?",
     "answers": ["Don Quixote"],
     "facts": [("Pride and Prejudice", "published in 1813"), ("Don Quixote", "1605")]},
    {"kind": "comparison", "question": "Which company was founded earlier, Amazon or Facebook?",
     "answers": ["Amazon", "Amazon.com", "Amazon (company)"],
     "facts": [("Amazon (company)", "Founded in 1994"), ("Facebook", "founded in 2004")]},
    {"kind": "comparison", "question": "Which mountain is lower, Mount Fuji or Mont Blanc?",
     "answers": ["Mount Fuji", "Fuji"],
     "facts": [("Mount Fuji", "3,776.24"), ("Mont Blanc", "4,807.3")]},
    {"kind": "comparison", "question": "Which city has fewer inhabitants, Tokyo or London?",
     "answers": ["London"],
     "facts": [("Tokyo", "over 14 million"), ("London", "9.1 million")]},
    {"kind": "comparison", "question": "Which university is older, the University of Cambridge or Yale University?",
     "answers": ["University of Cambridge", "Cambridge"],
     "facts": [("University of Cambridge", "Founded in 1209"), ("Yale University", "Founded in 1701")]},
    {"kind": "comparison", "question": "Which company was founded later, Apple Inc. or Amazon?",
     "answers": ["Amazon", "Amazon.com", "Amazon (company)"],
     "facts": [("Apple Inc.", "Founded in 1976"), ("Amazon (company)", "Founded in 1994")]},
    {"kind": "2-hop", "question": "In which city is the company that developed the iPhone headquartered?",
     "answers": ["Cupertino", "Cupertino, California"],
     "facts": [("IPhone", "developed and marketed by Apple"), ("Apple Inc.", "headquartered in Cupertino")]},
    {"kind": "2-hop", "question": "What is the capital of the country that borders Tanzania to the northeast?",
     "answers": ["Nairobi"],
     "facts": [("Tanzania", "Kenya to the northeast"), ("Kenya", "capital and largest city is Nairobi")]},
    {"kind": "2-hop", "question": "Where is the company co-founded by Bill Gates headquartered?",
     "answers": ["Redmond", "Redmond, Washington"],
     "facts": [("Bill Gates", "co-founded the software company Microsoft"),
               ("Microsoft", "headquartered in Redmond, Washington")]},
    {"kind": "2-hop", "question": "In which year was the college attended by the founders of Facebook founded?",
     "answers": ["1636"],
     "facts": [("Facebook", "Harvard College roommates"), ("Harvard University", "Founded in 1636")]},
]  # fmt: skip

RETRIEVERS = {"title field": 1.0, "passage only": 0.0}  # BM25Retriever(title_weight=...)


async def run_policy(spec: str, mode: str, title_weight: float) -> list[dict[str, Any]]:
    from ps_agent import ParallelSearchAgent
    from ps_agent.llms import resolve_text_policy
    from ps_agent.retrieval import BM25Retriever
    from ps_agent.retrieval.corpus import load_embedded_corpus

    resolve_text_policy(spec).expected = len(QUESTIONS)  # one loaded policy per spec: every turn in one batch
    retriever = BM25Retriever(load_embedded_corpus(), title_weight=title_weight)
    agent = ParallelSearchAgent(llm=spec, retriever=retriever, mode=mode, run_timeout_s=EVAL_RUN_TIMEOUT_S)
    outs = await asyncio.gather(*(agent.ainvoke(q["question"]) for q in QUESTIONS), return_exceptions=True)
    return [question_row(q, out) for q, out in zip(QUESTIONS, outs, strict=True)]


def question_row(question: dict[str, Any], out: dict[str, Any] | BaseException) -> dict[str, Any]:
    """One question's row; a run that failed (an agent error, a timeout on a loaded machine) is a wrong answer
    with its error, so one question does not lose the others' answers."""
    row = {"kind": question["kind"], "question": question["question"]}
    if isinstance(out, BaseException):
        return row | {"answer": "", "right": False, "searches": [], "llm_calls": None, "error": repr(out)}
    return row | {
        "answer": out["answer"], "right": bool(exact_match(out["answer"], question["answers"])),
        "searches": re.findall(r"<search>(.*?)</search>", out["trajectory"]["response"], re.S),
        "llm_calls": out["stats"]["llm_calls"], "error": None,
    }  # fmt: skip


def markdown(command: str, results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    kinds = sorted({q["kind"] for q in QUESTIONS}, reverse=True)
    lines = [f"`{command}`", "", "| policy | retriever | right | " + " | ".join(kinds) + " | LLM calls |",
             "|---|---|---|" + "---|" * len(kinds) + "---|"]  # fmt: skip
    for name, by_retriever in results.items():
        for retriever, rows in by_retriever.items():
            counts = [f"{sum(r['right'] for r in rows if r['kind'] == k)} of {sum(r['kind'] == k for r in rows)}"
                      for k in kinds]  # fmt: skip
            answered = [r["llm_calls"] for r in rows if r["llm_calls"] is not None]
            calls = sum(answered) / len(answered) if answered else float("nan")
            lines.append(f"| {name} | {retriever} | {sum(r['right'] for r in rows)} of {len(rows)} | "
                         + " | ".join(counts) + f" | {calls:.2f} |")  # fmt: skip
    for name, by_retriever in results.items():
        for retriever, rows in by_retriever.items():
            lines += ["", f"## {name}, {retriever}", "", "| question | searches | answer | right |",
                      "|---|---|---|---|"]  # fmt: skip
            lines += [f"| {r['question']} | {' / '.join(s.strip() for s in r['searches']) or '–'} | "
                      f"{r['answer'] if r.get('error') is None else 'failed: ' + r['error']} | "
                      f"{'yes' if r['right'] else 'no'} |" for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from ps_agent.llms import release_text_policies

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", required=True, help="NAME=SPEC[:MODE] (parallel), repeatable")
    parser.add_argument("--out", type=Path, default=RESULTS / "embedded_questions")
    args = parser.parse_args()
    policies = [parse_policy(item, default_mode="parallel") for item in args.policy]  # all, before the first runs
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, spec, mode in policies:
        for retriever, weight in RETRIEVERS.items():
            rows = results.setdefault(name, {})[retriever] = asyncio.run(run_policy(spec, mode, weight))
            print(f"{name}, {retriever}: {sum(r['right'] for r in rows)} of {len(rows)} right", flush=True)
        release_text_policies()  # one loaded policy at a time: three 0.5B policies at once exceed 24 GB
    command = "python benchmarks/embedded_questions.py " + " ".join(sys.argv[1:])
    save(args.out, {"command": command, "results": results}, markdown(command, results))


if __name__ == "__main__":
    main()
