"""Reliability benchmark: attack the agent the way a user, a model or a neighbour could, and count what breaks.

    python benchmarks/reliability.py [--quick] [--parts 1,2,3,4,5] [--turns 10000] [--clients 256] [--seconds 30]

1. Malformed model turns (a seeded generator: unclosed/nested tags, thousands of ``##`` sub-queries, huge turns,
   unicode and lone surrogates, control characters, rich markup, injected ``</information>``/``<answer>``, empty,
   tool-call garbage) through the real graph, both protocols and both modes, with scripted LLM doubles; and
   ``parse_action`` / ``close_action`` times on 64 KB and 1 MB adversarial turns.
2. Retriever faults: questions whose sub-queries raise, stall, return wrong shapes or block the event loop
   (in process), and 500s, stalls, malformed JSON, 422s and dropped connections from a fault-injecting HTTP
   server double through the real ``HTTPRetriever``: every question completes, every failure is recorded.
3. The retrieval server (``ps-agent serve-retriever`` as a subprocess) under concurrent clients with poisoned
   requests and clients that disconnect mid-request.
4. ``kill -9`` and resume: evaluation, a BM25 cache build, ``ps-agent index build`` and GRPO training.
5. Sync ``invoke`` in a loop with the HTTP retriever and ``ChatOpenAI`` against an OpenAI-compatible double:
   errors and open file descriptors.

Each part is a module of ``benchmarks/attacks/``. Every case reports cases tried, failures and seconds; results go
to benchmarks/results/reliability.{json,md} (``--out`` elsewhere). The LLMs, retrievers and HTTP servers marked
"double" are test doubles, named as such; the agent, graph, protocol parser, retrieval client, retrieval server,
eval, index build and trainer are real.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from benchmarks.attacks import Case  # noqa: E402
from benchmarks.attacks.faults import part2  # noqa: E402
from benchmarks.attacks.kills import part4  # noqa: E402
from benchmarks.attacks.malformed import part1  # noqa: E402
from benchmarks.attacks.server_load import part3  # noqa: E402
from benchmarks.attacks.sync_invokes import part5  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


NOTES = [
    "Run on a shared 2-core machine with other work beside it: times are upper bounds, counts are exact.",
    "Part 1 deals the turns in turn to the four protocol × mode settings; each run takes max_turns + 1 scripted turns "
    "(and 3 spare replies, so an over-calling graph is counted, not crashed); p50/p99 are per run with --gate runs "
    "in flight on one event loop.",
    "Part 2, HTTP: 8 questions at once (24 searches). With ~100 concurrent searches through one httpx pool of 64 "
    "keep-alive connections, bursts took ~2 s here against this double and against the real server alike "
    "(16 connections: ~0.5 s), so healthy searches hit the 0.3 s timeout; httpx's pool is known to be slow under "
    "concurrency (encode/httpx#3215).",
    "Part 5: the OpenAIChatDouble's handler sets TCP_NODELAY (it writes headers and body separately, and each "
    "reply otherwise waits ~40 ms for a delayed ACK: 130 → 59 ms per invoke).",
    "Part 4: a run is killed with SIGKILL to its process group at a random point after its imports (eval, GRPO: "
    "after a random amount of logged progress, plus a random delay); the BM25 and index builds are removed after a "
    "run that finished before its kill, so each kill hits a build. GRPO reruns resume from the newest checkpoint "
    "folder (--resume_from_checkpoint OUT/checkpoint-N, as the README shows), else rerun the same command.",
]


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Reliability benchmark",
        "",
        f"`{result['command']}` on {result['machine']}, {result['date']}; wall time {result['wall_s']:.0f} s.",
        "",
        "| part | case | tried | failures | time (s) | target | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        verdict = "–" if c["passed"] is None else ("pass" if c["passed"] else "**FAIL**")
        lines.append(f"| {c['part']} | {c['case']} | {c['tried']} | {c['failures']} | {c['seconds']:.2f} | "
                     f"{c['target']} | {verdict} |")  # fmt: skip
    lines += ["", "## Figures", ""]
    for c in result["cases"]:
        shown = {k: v for k, v in c["details"].items() if k not in ("turn_kinds", "by_kind", "log")}
        lines.append(f"- **{c['case']}**: " + json.dumps(shown, ensure_ascii=True, default=str)[:1500])
    lines += ["", "## Notes", ""] + [f"- {note}" for note in result["notes"]] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in under 2 minutes")
    parser.add_argument("--parts", default="1,2,3,4,5", help="comma-separated parts to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns", type=int, default=10_000, help="part 1: malformed turns, dealt to protocol × mode")
    parser.add_argument("--gate", type=int, default=32, help="parts 1-2: agent runs in flight at once")
    parser.add_argument("--case-timeout", type=float, default=10.0, help="part 1: seconds before a run is a hang")
    parser.add_argument("--fault-questions", type=int, default=200, help="part 2: questions, in-process faults")
    parser.add_argument("--http-fault-questions", type=int, default=100, help="part 2: questions, HTTP faults")
    parser.add_argument("--clients", type=int, default=256, help="part 3: concurrent clients")
    parser.add_argument("--seconds", type=float, default=30.0, help="part 3: seconds of load")
    parser.add_argument("--kills", type=int, default=10, help="part 4: kills of eval and of the BM25 build")
    parser.add_argument("--eval-questions", type=int, default=400)
    parser.add_argument("--index-kills", type=int, default=4)
    parser.add_argument("--grpo-kills", type=int, default=3)
    parser.add_argument("--grpo-steps", type=int, default=3, help="0 skips the GRPO case")
    parser.add_argument("--invokes", type=int, default=1000, help="part 5: sync invokes")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results for a full run, else a temp folder")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.fault_questions, args.http_fault_questions = 250, 28, 16
        args.clients, args.seconds, args.kills, args.eval_questions = 32, 4.0, 1, 60
        args.index_kills, args.grpo_kills, args.grpo_steps, args.invokes = 1, 0, 0, 100  # no GRPO: ~60 s of imports
    parts = {int(p) for p in args.parts.split(",")}

    logging.getLogger("ps_agent").setLevel(logging.ERROR)  # every injected search failure is a logged warning
    started = time.perf_counter()
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="ps-reliability-") as tmp:
        workdir = Path(tmp)
        for number, run in ((1, part1), (2, part2), (3, part3), (4, part4), (5, part5)):
            if number in parts:
                print(f"part {number} …", flush=True)
                t = time.perf_counter()
                cases += run(args) if number in (1, 2) else run(args, workdir)  # type: ignore[call-arg]
                print(f"part {number}: {time.perf_counter() - t:.0f} s", flush=True)

    result = {
        "command": "python benchmarks/reliability.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "sizes": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "wall_s": time.perf_counter() - started,
        "notes": NOTES,
        "cases": [asdict(c) for c in cases],
    }
    if args.out is None:  # a quick or partial run never overwrites the published results
        full = not args.quick and parts == {1, 2, 3, 4, 5}
        args.out = RESULTS if full else Path(tempfile.gettempdir()) / "ps-reliability"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reliability.json").write_text(json.dumps(result, indent=2, ensure_ascii=True, default=str) + "\n")
    (args.out / "reliability.md").write_text(markdown(result))
    print(f"wrote {args.out}/reliability.json and .md")
    print(markdown(result))


if __name__ == "__main__":
    main()
