"""Part 5: sync ``invoke`` in a loop with the HTTP retriever and ``ChatOpenAI`` against a double: errors and open
file descriptors."""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

from benchmarks.attacks import Case
from benchmarks.attacks.server_load import retrieval_server, write_corpus
from ps_agent import ParallelSearchAgent
from ps_agent.testing import OpenAIChatDouble


def part5(args: argparse.Namespace, workdir: Path) -> list[Case]:
    from langchain_openai import ChatOpenAI

    corpus = workdir / "corpus5.jsonl"
    write_corpus(corpus, 2000)
    errors: Counter = Counter()
    fds: list[int] = []
    with retrieval_server(corpus, workdir) as (_, url), OpenAIChatDouble() as double:
        llm = ChatOpenAI(base_url=double.base_url, api_key="EMPTY", model="double", max_retries=0, timeout=30)
        agents = [ParallelSearchAgent(llm=llm, retriever=f"{url}/retrieve", protocol=p) for p in ("tags", "tools")]
        start = time.perf_counter()
        for i in range(args.invokes):
            if i % 100 == 0:
                fds.append(len(os.listdir("/proc/self/fd")))
            try:
                out = agents[i % 2].invoke({"question": f"What is the capital of France? ({i})"})
                if out["answer"] != "Paris" or out["stats"]["failed_searches"]:
                    errors[f"answer {out['answer']!r}, failed searches {out['stats']['failed_searches']}"] += 1
            except Exception as exc:
                errors[f"{type(exc).__name__}: {str(exc)[:200]}"] += 1
        fds.append(len(os.listdir("/proc/self/fd")))
        wall = time.perf_counter() - start
    growth = fds[-1] - fds[1] if len(fds) > 2 else 0  # from after the first 100 calls (pools opened)
    failures = sum(errors.values())
    return [
        Case(5, "sync invoke × N (ChatOpenAI → double, HTTP retriever → server), tags/tools alternating",
             args.invokes, failures, wall, "0 errors", failures == 0,
             {"errors": dict(errors), "seconds_per_invoke": wall / max(1, args.invokes)}),
        Case(5, "open file descriptors, sampled every 100 invokes", len(fds), int(growth > 2), wall,
             "flat (growth ≤ 2 after the first 100)", growth <= 2, {"fds": fds}),
    ]  # fmt: skip
