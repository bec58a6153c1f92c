"""Fan-out benchmark: search-round wall-clock, parallel vs sequential, and the graph's overhead per turn.

    python benchmarks/fanout.py [--latency-ms 100] [--repeats 5] [--turns 8]

Writes benchmarks/results/fanout.json and fanout.md. Both sides of each ratio run in the same process,
one after the other, against the same retriever (a test double with injected latency) and an instant
scripted policy (a test double), so the numbers isolate the graph and the fan-out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path

from ps_agent import ParallelSearchAgent, Passage
from ps_agent.llms import Completion
from ps_agent.protocol import STOP_SEQUENCES, SubQueryObservation, parse_action, render_information, render_prompt
from ps_agent.retrieval import resilient_search

RESULTS = Path(__file__).parent / "results"


class LatencyRetriever:
    """Benchmark double: every query takes ``latency_s``."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def asearch(self, queries, k):
        await asyncio.sleep(self.latency_s)
        return [[Passage(f"{q}-{i}", f"T{i}", f"passage {i} for {q}") for i in range(k)] for q in queries]


class ScriptedPolicy:
    """Benchmark double: an instant policy that replays ``turns`` (a fresh copy per run)."""

    def __init__(self, turns: list[str]) -> None:
        self.turns = turns
        self.i = 0

    async def acomplete(self, prompt, transcript, *, stop, max_tokens):
        text = self.turns[self.i]
        self.i += 1
        return Completion(text=text, prompt_text=prompt)


def _search(queries: list[str]) -> str:
    return f"<search> {' ## '.join(queries)} </search>"


async def run_agent(turns: list[str], retriever, mode: str, max_turns: int) -> tuple[float, dict]:
    agent = ParallelSearchAgent(llm=ScriptedPolicy(turns), retriever=retriever, mode=mode, max_turns=max_turns)
    start = time.perf_counter()
    out = await agent.ainvoke({"question": "benchmark question"})
    return time.perf_counter() - start, out


async def fanout(latency_s: float, repeats: int) -> list[dict]:
    retriever = LatencyRetriever(latency_s)
    rows = []
    for k in (1, 2, 4, 8):
        queries = [f"sub-query {i}" for i in range(k)]
        parallel, sequential = [], []
        for _ in range(repeats):
            seconds, out = await run_agent([_search(queries), "<answer> x </answer>"], retriever, "parallel", 10)
            assert out["stats"]["sub_queries"] == k
            parallel.append((seconds, sum(r["latency_s"] for r in out["trajectory"]["search_rounds"])))
            turns = [_search([q]) for q in queries] + ["<answer> x </answer>"]
            seconds, out = await run_agent(turns, retriever, "sequential", 10)
            assert out["stats"]["search_rounds"] == k
            sequential.append((seconds, sum(r["latency_s"] for r in out["trajectory"]["search_rounds"])))
        p_total = statistics.median(s for s, _ in parallel)
        s_total = statistics.median(s for s, _ in sequential)
        p_search = statistics.median(r for _, r in parallel)
        s_search = statistics.median(r for _, r in sequential)
        rows.append(
            {
                "k": k,
                "parallel_search_s": p_search,
                "sequential_search_s": s_search,
                "search_speedup": s_search / p_search,
                "parallel_run_s": p_total,
                "sequential_run_s": s_total,
                "run_speedup": s_total / p_total,
                "target_speedup": 0.9 * k,
            }
        )
    return rows


async def plain_loop(turns: list[str], retriever, max_turns: int) -> float:
    """The same algorithm as the graph in a plain Python loop: the baseline for graph overhead."""
    policy = ScriptedPolicy(turns)
    prompt, transcript = render_prompt("benchmark question"), []
    start = time.perf_counter()
    for _ in range(max_turns):
        completion = await policy.acomplete(prompt, transcript, stop=STOP_SEQUENCES, max_tokens=256)
        transcript.append({"role": "model", "text": completion.text, "token_ids": None})
        action = parse_action(completion.text)
        if action.kind == "answer":
            break
        outcomes = await asyncio.gather(*(resilient_search(retriever, q, 3) for q in action.sub_queries))
        observations = [
            SubQueryObservation(q, [(p.title, p.text) for p in o.passages], o.error)
            for q, o in zip(action.sub_queries, outcomes, strict=True)
        ]
        transcript.append({"role": "env", "text": render_information(observations), "token_ids": None})
    return time.perf_counter() - start


async def overhead(turns: int, repeats: int) -> dict:
    retriever = LatencyRetriever(0.0)
    script = [_search(["a", "b"])] * turns + ["<answer> x </answer>"]
    graph_s, loop_s = [], []
    for _ in range(repeats):
        seconds, out = await run_agent(script, retriever, "parallel", turns + 1)
        assert out["stats"]["llm_calls"] == turns + 1
        graph_s.append(seconds)
        loop_s.append(await plain_loop(script, retriever, turns + 1))
    graph, loop = statistics.median(graph_s), statistics.median(loop_s)
    return {
        "turns": turns + 1,
        "graph_s": graph,
        "plain_loop_s": loop,
        "graph_overhead_ms_per_turn": 1000 * (graph - loop) / (turns + 1),
        "target_ms_per_turn": 5.0,
    }


def markdown(result: dict) -> str:
    lines = [
        "# Fan-out benchmark",
        "",
        f"`python benchmarks/fanout.py --latency-ms {result['latency_ms']} --repeats {result['repeats']}` "
        f"on {result['machine']}; medians.",
        "",
        "| k | parallel search (s) | sequential search (s) | speed-up | target ≥ 0.9·k "
        "| whole run: parallel / sequential (s) |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["fanout"]:
        ok = "met" if row["search_speedup"] >= row["target_speedup"] else "missed"
        lines.append(
            f"| {row['k']} | {row['parallel_search_s']:.3f} | {row['sequential_search_s']:.3f} | "
            f"{row['search_speedup']:.2f}× | {row['target_speedup']:.1f}× ({ok}) | "
            f"{row['parallel_run_s']:.3f} / {row['sequential_run_s']:.3f} |"
        )
    o = result["overhead"]
    lines += [
        "",
        f"Graph overhead: {o['graph_overhead_ms_per_turn']:.2f} ms per turn over a plain Python loop "
        f"({o['turns']} turns: graph {o['graph_s'] * 1000:.1f} ms, loop {o['plain_loop_s'] * 1000:.1f} ms; "
        f"target < {o['target_ms_per_turn']:.0f} ms).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=100.0, help="injected retriever latency per query")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=8, help="search turns in the overhead run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    result = {
        "latency_ms": args.latency_ms,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "fanout": asyncio.run(fanout(args.latency_ms / 1000, args.repeats)),
        "overhead": asyncio.run(overhead(args.turns, args.repeats)),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fanout.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "fanout.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
