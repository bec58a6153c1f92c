"""Part 4: ``kill -9`` and resume of an evaluation, a BM25 cache build, ``ps-agent index build`` and GRPO training."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.attacks import PS_AGENT, PYTHON, ROOT, Case
from ps_agent.eval import dataset_name


def run_child(command: list[str], kill_when: Callable[[float], bool] | None, log: Path, env: dict | None = None,
              timeout_s: float = 600) -> tuple[str, int | None, float]:  # fmt: skip
    """Run ``command`` in its own process group; SIGKILL the group once ``kill_when(elapsed)`` holds.
    Returns ("killed" | "finished" | "timeout", exit code, seconds)."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                   start_new_session=True)  # fmt: skip
        start = time.monotonic()
        while process.poll() is None:
            elapsed = time.monotonic() - start
            if (kill_when is not None and kill_when(elapsed)) or elapsed > timeout_s:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return ("killed" if elapsed <= timeout_s else "timeout"), None, elapsed
            time.sleep(0.005)
        return "finished", process.returncode, time.monotonic() - start


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def progress_killer(progress: Callable[[], int], target: int, rng: random.Random, jitter_s: float) -> Callable:
    """Kill once ``progress()`` reaches ``target``, then after a random delay of up to ``jitter_s``."""
    reached: list[float] = []
    delay = rng.uniform(0, jitter_s)

    def kill_when(elapsed: float) -> bool:
        if not reached and progress() >= target:
            reached.append(elapsed)
        return bool(reached) and elapsed >= reached[0] + delay

    return kill_when


def after_marker(log: Path, delay_s: float, seen: list[float] | None = None) -> Callable[[float], bool]:
    """Kill ``delay_s`` after the child prints one more ``ready`` line to ``log`` than it holds now (its imports
    done); ``seen`` gets the elapsed time at which it did."""
    baseline = log.read_bytes().count(b"\nready\n") if log.is_file() else 0
    seen = [] if seen is None else seen

    def kill_when(elapsed: float) -> bool:
        if not seen and log.read_bytes().count(b"\nready\n") > baseline:
            seen.append(elapsed)
        return bool(seen) and elapsed >= seen[0] + delay_s

    return kill_when


def jsonl_integrity(paths: list[Path], key: Callable[[dict], Any]) -> tuple[Counter, int]:
    """Whole records per key (``key`` None skips a record), and torn (unparseable) lines."""
    counts: Counter = Counter()
    torn = 0
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                torn += 1
                continue
            k = key(record)
            if k is not None:
                counts[k] += 1
    return counts, torn


EVAL_CHILD = """
import asyncio, sys
from ps_agent.eval import EvalSettings, evaluate
from ps_agent.llms import Completion
from ps_agent.testing import SleepyRetriever

class TwoTurnPolicyDouble:  # benchmark double: search two sub-queries, then answer
    async def acomplete(self, prompt, transcript, *, stop, max_tokens):
        await asyncio.sleep(0.005)
        text = "<search> a ## b </search>" if not transcript else "<answer> x </answer>"
        return Completion(text=text, prompt_text="")

print("ready", flush=True)
settings = EvalSettings(llm=TwoTurnPolicyDouble(), retriever=SleepyRetriever(0.005), modes=("parallel",), concurrency=8)
evaluate([sys.argv[1]], sys.argv[2], settings)
"""


def kill_eval(kills: int, questions: int, workdir: Path, rng: random.Random) -> Case:
    folder = workdir / "eval"
    folder.mkdir()
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["x"],
                                        "type": "comparison"}) + "\n" for i in range(questions)))  # fmt: skip
    out = folder / "out"
    results = out / "results" / f"{dataset_name(data)}.parallel.jsonl"
    command = [PYTHON, "-c", EVAL_CHILD, str(data), str(out)]
    log = folder / "log.txt"
    outcomes: Counter = Counter()
    start = time.perf_counter()
    for i in range(kills):
        done = line_count(results)
        target = done + round(rng.uniform(0.2, 1.0) * (questions - done) / (kills - i + 1))
        outcome, code, _ = run_child(command, progress_killer(lambda: line_count(results), target, rng, 0.05), log)
        outcomes[outcome if code in (None, 0) else f"exit {code}"] += 1
    outcome, code, _ = run_child(command, None, log)
    final_ok = outcome == "finished" and code == 0
    ok_lines, torn = jsonl_integrity([results], lambda r: r["id"] if r.get("error") is None else None)
    expected = {f"q{i}" for i in range(questions)}
    lost = len(expected - set(ok_lines))
    duplicated = sum(n - 1 for n in ok_lines.values() if n > 1)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    n_reported = summary.get("overall", {}).get("parallel", {}).get("n")
    failures = lost + duplicated + int(not final_ok) + int(n_reported != questions) + outcomes["timeout"]
    return Case(4, "kill -9 · eval (resume skips finished ids)", kills, failures, time.perf_counter() - start,
                "0 lost, 0 duplicated; rerun completes", failures == 0,
                {"questions": questions, "kill_outcomes": dict(outcomes), "lost": lost, "duplicated": duplicated,
                 "torn_fragments_kept_in_file": torn, "final_rerun_ok": final_ok,
                 "report_n": n_reported}
                | ({} if failures == 0 else {"log_tail": log.read_text()[-1500:]}))  # fmt: skip


BM25_CHILD = """
import sys
from ps_agent.retrieval import BM25Retriever
from ps_agent.retrieval.corpus import load_embedded_corpus
passages = load_embedded_corpus()
print("ready", flush=True)
BM25Retriever(passages, cache=sys.argv[1])
"""


def kill_bm25(kills: int, workdir: Path, rng: random.Random) -> Case:
    folder = workdir / "bm25"
    folder.mkdir()
    log = folder / "log.txt"
    # calibration: one whole build elsewhere, for the kill window (from "ready", after the imports)
    ready: list[float] = []
    _, _, full = run_child([PYTHON, "-c", BM25_CHILD, str(folder / "calibration")], after_marker(log, 1e9, ready), log)
    build = full - ready[0]
    shutil.rmtree(folder / "calibration")
    cache = folder / "caches" / "embedded"
    command = [PYTHON, "-c", BM25_CHILD, str(cache)]
    outcomes: Counter = Counter()
    start = time.perf_counter()
    for _ in range(kills):
        outcome, code, _ = run_child(command, after_marker(log, rng.uniform(0, build)), log)
        outcomes[outcome if code in (None, 0) else f"exit {code}"] += 1
        if outcome == "finished":  # built whole before the kill: start the next build afresh
            shutil.rmtree(cache)
    outcome, code, _ = run_child(command, None, log)
    check = subprocess.run(
        [PYTHON, "-c", "import sys, logging; logging.basicConfig(level=logging.WARNING)\n" + BM25_CHILD.replace(
            'print("ready", flush=True)\n', "") + "r = BM25Retriever(passages, cache=sys.argv[1])\n"
         "print(len(r.search(['Mount Everest'], 3)[0]))", str(cache)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    loads = check.returncode == 0 and check.stdout.strip() == "3" and "rebuilding" not in check.stderr
    litter = sorted(p.name for p in cache.parent.iterdir() if p != cache)
    failures = int(not (outcome == "finished" and code == 0)) + int(not loads) + outcomes["timeout"]
    return Case(4, "kill -9 · BM25 cache build", kills, failures, time.perf_counter() - start,
                "rerun completes; the cache then loads (no rebuild)", failures == 0,
                {"build_seconds": build, "kill_outcomes": dict(outcomes), "final_rerun": f"{outcome} {code}",
                 "loads_and_searches": loads, "load_stderr": check.stderr[-500:],
                 "leftover_entries_beside_cache": len(litter), "leftover_examples": litter[:4]})  # fmt: skip


def kill_index(kills: int, workdir: Path, rng: random.Random) -> Case:
    folder = workdir / "index"
    folder.mkdir()
    log = folder / "log.txt"
    env = os.environ | {"PS_AGENT_CACHE": str(folder / "cache")}

    def command(out: Path) -> list[str]:
        return [PS_AGENT, "index", "build", "--corpus", "embedded", "--index", "bm25", "--out", str(out)]

    _, _, full = run_child(command(folder / "calibration"), None, log, env)
    shutil.rmtree(folder / "calibration")
    out = folder / "idx"
    outcomes: Counter = Counter()
    start = time.perf_counter()
    for _ in range(kills):
        at = rng.uniform(0.3 * full, 0.95 * full)  # imports take the first part of a run
        outcome, code, _ = run_child(command(out), lambda elapsed, at=at: elapsed >= at, log, env)
        outcomes[outcome if code in (None, 0) else f"exit {code}"] += 1
        if outcome == "finished":
            shutil.rmtree(out)
    outcome, code, _ = run_child(command(out), None, log, env)
    check = subprocess.run(
        [PYTHON, "-c", "import sys\nfrom ps_agent.retrieval.index import load_index\n"
         "print(len(load_index(sys.argv[1], 'bm25').search(['Mount Everest'], 3)[0]))", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    loads = check.returncode == 0 and check.stdout.strip() == "3"
    litter = sorted(p.name for p in out.iterdir() if "partial" in p.name or "stale" in p.name) if out.is_dir() else []
    failures = int(not (outcome == "finished" and code == 0)) + int(not loads) + outcomes["timeout"]
    return Case(4, "kill -9 · ps-agent index build --index bm25", kills, failures, time.perf_counter() - start,
                "rerun completes and loads", failures == 0,
                {"build_seconds": full, "kill_outcomes": dict(outcomes), "final_rerun": f"{outcome} {code}",
                 "loads_and_searches": loads, "load_stderr": check.stderr[-500:],
                 "leftover_partial_entries": len(litter), "leftover_examples": litter[:4]})  # fmt: skip


TINY_MODEL_CHILD = """
import sys
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from ps_agent.llms import embedded_model_path
tokenizer = AutoTokenizer.from_pretrained(embedded_model_path("smollm2"))
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                     tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
LlamaForCausalLM(config).save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
"""


def kill_grpo(kills: int, steps: int, workdir: Path, rng: random.Random) -> Case:
    """``training/run_grpo.py`` with the tests' tiny model recipe, killed during its rollouts, optimizer steps and
    checkpoint saves (the first kill before any checkpoint exists). Each rerun resumes from the newest checkpoint
    folder, as the README shows (``--resume_from_checkpoint OUT/checkpoint-N``), or starts again when there is
    none. A rerun that fails on a checkpoint the kill left half-written gets the manual cleanup a user would do
    (that folder deleted), counted."""
    folder = workdir / "grpo"
    folder.mkdir()
    log = folder / "log.txt"
    model = folder / "tiny-llama"
    subprocess.run([PYTHON, "-c", TINY_MODEL_CHILD, str(model)], check=True, cwd=ROOT, capture_output=True)
    out = folder / "run"
    per_step = 2  # per_device_train_batch_size 2, num_generations 2
    base = [PYTHON, "training/run_grpo.py", "--model_name_or_path", str(model), "--output_dir", str(out),
            "--data", "builtin", "--limit", "4", "--num_generations", "2", "--per_device_train_batch_size", "2",
            "--max_turns", "1", "--max_new_tokens", "8", "--topk", "1", "--report_to", "none", "--save_steps", "1",
            "--max_steps", str(steps)]  # fmt: skip

    def newest_checkpoint() -> Path | None:
        found = [(int(p.name.split("-")[1]), p) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
        return max(found)[1] if found else None

    def command() -> list[str]:
        checkpoint = newest_checkpoint()
        return base + (["--resume_from_checkpoint", str(checkpoint)] if checkpoint else [])

    def rollouts_logged() -> int:
        return sum(line_count(p) for p in out.glob("trajectories*.jsonl"))

    def appended() -> Callable[[], int]:
        """Rollouts this run has logged (a resumed run first drops the steps it redoes)."""
        low = [rollouts_logged()]

        def progress() -> int:
            low[0] = min(low[0], rollouts_logged())
            return rollouts_logged() - low[0]

        return progress

    outcomes: Counter = Counter()
    failed: list[str] = []
    cleanups: list[str] = []

    def rerun(kill_when: Callable[[float], bool] | None) -> tuple[str, int | None]:
        for _ in range(3):
            outcome, code, _ = run_child(command(), kill_when, log)
            if code in (None, 0):
                return outcome, code
            last = log.read_text().strip().splitlines()[-1][:300]
            failed.append(f"exit {code}: {last}")
            checkpoint = newest_checkpoint()
            if checkpoint is None or (checkpoint / "trainer_state.json").is_file():
                return outcome, code
            cleanups.append(f"deleted {checkpoint.name} (no trainer_state.json)")
            shutil.rmtree(checkpoint)
        return outcome, code

    start = time.perf_counter()
    for i in range(kills):
        checkpoint = newest_checkpoint()
        remaining = per_step * (steps - (int(checkpoint.name.split("-")[1]) if checkpoint else 0))
        if i == 0:  # the first kill: once step 0's rollouts are logged, before its checkpoint is saved
            kill_when = progress_killer(appended(), per_step, rng, 0.5)
        else:
            kill_when = progress_killer(appended(), rng.randint(1, max(1, remaining)), rng, 8.0)
        outcome, _ = rerun(kill_when)
        outcomes[outcome] += 1
    outcome, code = rerun(None)
    final_ok = outcome == "finished" and code == 0
    per_step_counts, torn = jsonl_integrity(sorted(out.glob("trajectories*.jsonl")), lambda r: r["step"])
    lost = sum(max(0, per_step - per_step_counts.get(s, 0)) for s in range(steps))
    duplicated = sum(max(0, n - per_step) for n in per_step_counts.values())
    failures = lost + duplicated + int(not final_ok) + len(failed) + outcomes["timeout"]
    return Case(4, f"kill -9 · GRPO training ({steps} steps, tiny model)", kills, failures,
                time.perf_counter() - start,
                f"each step's {per_step} rollouts logged once; every rerun completes with no cleanup", failures == 0,
                {"steps": steps, "kill_outcomes": dict(outcomes),
                 "rollouts_per_step": dict(sorted(per_step_counts.items())),
                 "lost": lost, "duplicated": duplicated, "torn_lines": torn, "final_rerun": f"{outcome} {code}",
                 "reruns_failed": failed, "manual_cleanups": cleanups}
                | ({} if final_ok else {"log_tail": log.read_text()[-1500:]}))  # fmt: skip


def part4(args: argparse.Namespace, workdir: Path) -> list[Case]:
    rng = random.Random(args.seed)
    runs = [
        lambda: kill_eval(args.kills, args.eval_questions, workdir, rng),
        lambda: kill_bm25(args.kills, workdir, rng),
        lambda: kill_index(args.index_kills, workdir, rng),
    ]
    if args.grpo_steps > 0:
        runs.append(lambda: kill_grpo(args.grpo_kills, args.grpo_steps, workdir, rng))
    cases = []
    for run in runs:
        case = run()
        print(f"  {case.case}: {case.tried} kills, {case.failures} failures, {case.seconds:.1f} s", flush=True)
        cases.append(case)
    return cases
