"""Scaling: LLM calls and wall-clock per question vs comparison width k and chain depth d, on the synthetic
world, parallel vs sequential mode, for the gold-plan oracle and for SmolLM2, against the optimum.

    python benchmarks/scaling.py [--latency-ms 50] [--smollm2-per-setting 1]

The oracle (a benchmark double) searches each question's gold plan, so its numbers are the best any
policy can do through this graph and index; the searches carry an injected latency so that wall-clock
reflects search time as it would against a real backend. Writes benchmarks/results/scaling.{json,md} and
figures/scaling.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import figure  # noqa: E402
from ps_agent import ParallelSearchAgent  # noqa: E402
from ps_agent.metrics import exact_match  # noqa: E402
from ps_agent.retrieval import resolve_retriever  # noqa: E402
from ps_agent.synthetic import GoldPlanPolicy, generate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


class DelayedRetriever:
    """Benchmark double: a real retriever behind an injected per-call latency."""

    def __init__(self, inner, latency_s: float) -> None:
        self.inner, self.latency_s = inner, latency_s

    async def asearch(self, queries, k):
        await asyncio.sleep(self.latency_s)
        return await self.inner.asearch(queries, k)


def setting(q: dict) -> str:
    return {"comparison": f"comparison k={q['k']}", "bridge": f"bridge d={q['depth']}",
            "hybrid": f"hybrid k={q['k']} d={q['depth']}", "single-hop": "single-hop", "yes-no": "yes/no k=2",
            "ranked": "ranked k=2"}[q["family"]]  # fmt: skip


def run(policy_name: str, llm, retriever, questions: list[dict], mode: str, **agent_kwargs) -> list[dict]:
    agent = ParallelSearchAgent(llm=llm, retriever=retriever, mode=mode, **agent_kwargs)
    rows = []
    for q in questions:
        start = time.perf_counter()
        out = agent.invoke(q["question"])
        rows.append({
            "policy": policy_name, "mode": mode, "setting": setting(q), "family": q["family"], "k": q["k"],
            "depth": q["depth"], "llm_calls": out["stats"]["llm_calls"], "search_rounds": out["stats"]["search_rounds"],
            "optimal_llm_calls": q["optimal_llm_calls"], "seconds": time.perf_counter() - start,
            "em": exact_match(out["answer"], q["golden_answers"]), "decomposed": out["stats"]["decomposed"],
        })  # fmt: skip
    return rows


def table(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["setting"], r["mode"]), []).append(r)
    out = []
    for (policy, name, mode), rs in groups.items():
        out.append({
            "policy": policy, "setting": name, "mode": mode, "n": len(rs),
            "llm_calls": statistics.mean(r["llm_calls"] for r in rs),
            "optimal_llm_calls": statistics.mean(r["optimal_llm_calls"] for r in rs),
            "seconds": statistics.mean(r["seconds"] for r in rs), "em": 100 * statistics.mean(r["em"] for r in rs),
            "decomposed": 100 * statistics.mean(float(r["decomposed"]) for r in rs),
        })  # fmt: skip
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for policy, mode, style in (("oracle", "parallel", "o-"), ("oracle", "sequential", "s--"),
                                ("smollm2", "parallel", "^-"), ("smollm2", "sequential", "v--")):  # fmt: skip
        for ax, family, x in ((axes[0], "comparison", "k"), (axes[1], "bridge", "depth")):
            pts = sorted((r[x], r["llm_calls"]) for r in rows if r["policy"] == policy and r["mode"] == mode
                         and r["family"] == family)  # fmt: skip
            xs = sorted({p[0] for p in pts})
            if xs:
                ys = [statistics.mean(v for kx, v in pts if kx == xv) for xv in xs]
                ax.plot(xs, ys, style, label=f"{policy} · {mode}")
        pts = sorted((r["k"], r["seconds"]) for r in rows if r["policy"] == policy and r["mode"] == mode
                     and r["family"] == "comparison")  # fmt: skip
        xs = sorted({p[0] for p in pts})
        if xs:
            axes[2].plot(xs, [statistics.mean(v for kx, v in pts if kx == xv) for xv in xs], style,
                         label=f"{policy} · {mode}")  # fmt: skip
    axes[0].plot(range(2, 9), [2] * 7, "k:", label="optimum (1 round + answer)")
    axes[1].plot([2, 3, 4], [3, 4, 5], "k:", label="optimum (d + 1)")
    for ax, title, xlabel in ((axes[0], "LLM calls vs comparison width", "k"),
                              (axes[1], "LLM calls vs chain depth", "d"),
                              (axes[2], "seconds per question vs width", "k")):  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--smollm2-per-setting", type=int, default=1, help="0 skips the SmolLM2 runs")
    parser.add_argument("--llm", default="smollm2", help="SmolLM2 spec: smollm2 (in process) or vllm:URL (served)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="ps-synth-"))
    corpus, qfile = generate(args.seed, 300, folder, per_family=3)
    questions = [json.loads(line) for line in qfile.read_text().splitlines()]
    retriever = DelayedRetriever(resolve_retriever(str(corpus)), args.latency_ms / 1000)
    rows = []
    for mode in ("parallel", "sequential"):
        rows += run("oracle", GoldPlanPolicy(questions, mode), retriever, questions, mode, max_turns=30)
    if args.smollm2_per_setting:
        chosen, seen = [], {}
        for q in questions:
            if seen.get(setting(q), 0) < args.smollm2_per_setting:
                seen[setting(q)] = seen.get(setting(q), 0) + 1
                chosen.append(q)
        for mode in ("parallel", "sequential"):
            rows += run(
                "smollm2", args.llm, retriever, chosen, mode, max_turns=4, max_new_tokens=96, demonstration=True
            )
    summary = table(rows)
    result = {"command": "python benchmarks/scaling.py " + " ".join(sys.argv[1:]), "latency_ms": args.latency_ms,
              "rows": rows, "table": summary}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, figure(args.out / "scaling"))
    lines = ["# Scaling on the synthetic world", "", f"`{result['command']}` (search latency {args.latency_ms:g} ms)",
             "", "| policy | setting | mode | n | LLM calls | optimum | s/question | EM % | decomposed % |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in summary:
        lines.append(
            f"| {r['policy']} | {r['setting']} | {r['mode']} | {r['n']} | {r['llm_calls']:.2f} | "
            f"{r['optimal_llm_calls']:.0f} | {r['seconds']:.2f} | {r['em']:.0f} | {r['decomposed']:.0f} |"
        )
    (args.out / "scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
