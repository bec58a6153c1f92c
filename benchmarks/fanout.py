"""Fan-out benchmark: search-round wall-clock, parallel vs sequential, and the graph's overhead per turn,
through the async ``ainvoke`` and the sync ``invoke`` paths, on a sleeping retriever and on real BM25.

    python benchmarks/fanout.py [--latency-ms 100] [--repeats 5] [--turns 8] [--overhead-repeats 30]

Writes benchmarks/results/fanout.json and fanout.md. Both sides of each ratio run in the same process,
one after the other, against the same retriever and an instant scripted policy (a test double), so the
numbers isolate the graph and the fan-out. The sleeping retriever (a test double with injected latency)
stands for a remote one; BM25 over the embedded corpus runs in process (CPU work in a thread per search).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from ps_agent import ParallelSearchAgent, Passage
from ps_agent.llms import Completion
from ps_agent.protocol import STOP_SEQUENCES, SubQueryObservation, parse_action, render_information, render_prompt
from ps_agent.retrieval import bm25_for_corpus, resilient_search
from ps_agent.retrieval.corpus import load_embedded_corpus

RESULTS = Path(__file__).parent / "results"
PATHS = ("ainvoke", "invoke", "graph.invoke")  # agent.invoke runs ainvoke once; graph.invoke steps node by node
LOOP = asyncio.new_event_loop()  # the ainvoke path's caller loop, kept for every run


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


def run_agent(path: str, turns: list[str], retriever, mode: str, max_turns: int) -> tuple[float, dict]:
    """One run through ``path``: seconds from the call to its result, and the output."""
    agent = ParallelSearchAgent(llm=ScriptedPolicy(turns), retriever=retriever, mode=mode, max_turns=max_turns)
    question = {"question": "benchmark question"}
    if path != "ainvoke":
        start = time.perf_counter()
        out = agent.invoke(question) if path == "invoke" else agent.graph.invoke(question)
        return time.perf_counter() - start, out

    async def run() -> tuple[float, dict]:
        start = time.perf_counter()
        out = await agent.ainvoke(question)
        return time.perf_counter() - start, out

    return LOOP.run_until_complete(run())


def fanout(path: str, retriever, queries: list[str], repeats: int) -> list[dict]:
    rows = []
    for k in (1, 2, 4, 8):
        parallel, sequential = [], []
        for _ in range(repeats):
            seconds, out = run_agent(path, [_search(queries[:k]), "<answer> x </answer>"], retriever, "parallel", 10)
            assert out["stats"]["sub_queries"] == k and out["stats"]["failed_searches"] == 0
            parallel.append((seconds, sum(r["latency_s"] for r in out["trajectory"]["search_rounds"])))
            turns = [_search([q]) for q in queries[:k]] + ["<answer> x </answer>"]
            seconds, out = run_agent(path, turns, retriever, "sequential", 10)
            assert out["stats"]["search_rounds"] == k and out["stats"]["failed_searches"] == 0
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


def overhead(path: str, retriever, queries: list[str], turns: int, repeats: int) -> dict:
    """Wall-clock and CPU time (all threads) of the graph against the plain loop, per turn."""
    script = [_search(queries[:2])] * turns + ["<answer> x </answer>"]
    graph_s, graph_cpu_s, loop_s, loop_cpu_s = [], [], [], []
    for _ in range(repeats):
        cpu = time.process_time()
        seconds, out = run_agent(path, script, retriever, "parallel", turns + 1)
        graph_cpu_s.append(time.process_time() - cpu)
        assert out["stats"]["llm_calls"] == turns + 1 and out["stats"]["failed_searches"] == 0
        graph_s.append(seconds)
        cpu = time.process_time()
        loop_s.append(LOOP.run_until_complete(plain_loop(script, retriever, turns + 1)))
        loop_cpu_s.append(time.process_time() - cpu)
    graph, loop = statistics.median(graph_s), statistics.median(loop_s)
    cpu_overhead = statistics.median(graph_cpu_s) - statistics.median(loop_cpu_s)
    return {
        "turns": turns + 1,
        "graph_s": graph,
        "plain_loop_s": loop,
        "graph_overhead_ms_per_turn": 1000 * (graph - loop) / (turns + 1),
        "graph_cpu_overhead_ms_per_turn": 1000 * cpu_overhead / (turns + 1),
        "target_ms_per_turn": 5.0,
    }


def markdown(result: dict) -> str:
    lines = [
        "# Fan-out benchmark",
        "",
        f"`{result['command']}` on {result['machine']}; 1-minute load average {result['load_average'][0]:.1f} "
        f"before, {result['load_average'][1]:.1f} after; fan-out: medians of {result['repeats']} runs.",
        "",
        "Search time of one question whose k sub-queries are searched in one parallel round, against k sequential",
        "rounds (Search-R1's mode), through each path: `agent.ainvoke`; `agent.invoke` (sync: `ainvoke` on the",
        "shared event loop); `agent.graph.invoke` (the graph's own sync path, each node through `run_sync`).",
        "The speed-up target (≥ 0.9·k) is for a retriever that waits on I/O (the sleeping one, standing for a",
        "remote index); in-process BM25 is CPU work, so its fan-out is bounded by the cores and the GIL, and it",
        "is shown beside it without a target.",
        "",
        "| path | retriever | k | parallel search (s) | sequential search (s) | speed-up | target ≥ 0.9·k "
        "| whole run: parallel / sequential (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        for row in run["fanout"]:
            target = f"{row['target_speedup']:.1f}×"
            if run["retriever"].startswith("sleeping"):
                target += " (met)" if row["search_speedup"] >= row["target_speedup"] else " (missed)"
            else:
                target = "—"
            lines.append(
                f"| `{run['path']}` | {run['retriever']} | {row['k']} | {row['parallel_search_s']:.4f} | "
                f"{row['sequential_search_s']:.4f} | {row['search_speedup']:.2f}× | {target} | "
                f"{row['parallel_run_s']:.4f} / {row['sequential_run_s']:.4f} |"
            )
    lines += [
        "",
        "Graph overhead per turn over the same algorithm in a plain Python loop (2 sub-queries a turn, "
        f"{result['runs'][0]['overhead']['turns']} turns; medians of {result['overhead_repeats']} runs of each, "
        "interleaved), in wall-clock time and in CPU time (all threads; what a busy machine inflates least):",
        "",
        "| path | retriever | graph (ms) | plain loop (ms) | overhead per turn (ms) | target < 5 ms "
        "| CPU overhead per turn (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        o = run["overhead"]
        ok = "met" if o["graph_overhead_ms_per_turn"] < o["target_ms_per_turn"] else "missed"
        lines.append(
            f"| `{run['path']}` | {run['retriever']} | {o['graph_s'] * 1000:.1f} | {o['plain_loop_s'] * 1000:.1f} | "
            f"{o['graph_overhead_ms_per_turn']:.2f} | {ok} | {o['graph_cpu_overhead_ms_per_turn']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=100.0, help="injected retriever latency per query")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=8, help="search turns in the overhead run")
    parser.add_argument("--overhead-repeats", type=int, default=30, help="overhead runs (each well under 0.1 s)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    load_before = os.getloadavg()[0]  # other work on the machine stretches wall-clock times: recorded with them
    bm25 = bm25_for_corpus()
    titles = [p.title for p in load_embedded_corpus()[:8]]  # real queries: each finds its own article
    sleeping = [f"sub-query {i}" for i in range(8)]
    kinds = [  # name, fan-out retriever, overhead retriever (no latency to hide the graph's own time), queries
        (f"sleeping ({args.latency_ms:g} ms; 0 ms for overhead)", LatencyRetriever(args.latency_ms / 1000),
         LatencyRetriever(0.0), sleeping),
        ("BM25, embedded corpus", bm25, bm25, titles),
    ]  # fmt: skip
    runs = [
        {
            "path": path,
            "retriever": name,
            "fanout": fanout(path, retriever, queries, args.repeats),
            "overhead": overhead(path, fast, queries, args.turns, args.overhead_repeats),
        }
        for path in PATHS
        for name, retriever, fast, queries in kinds
    ]
    result = {
        "command": " ".join(["python", "benchmarks/fanout.py", *sys.argv[1:]]),
        "latency_ms": args.latency_ms,
        "repeats": args.repeats,
        "overhead_repeats": args.overhead_repeats,
        "machine": f"{platform.machine()} ({os.cpu_count()} cores), Python {platform.python_version()}",
        "load_average": [load_before, os.getloadavg()[0]],
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fanout.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "fanout.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
