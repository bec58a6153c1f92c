"""SFT throughput, side by side in one run: TRL's defaults against the settings run_sft.py uses.

    python benchmarks/sft_speed.py [--model smollm2] [--episodes runs/gold/parallel.jsonl] [--steps 6] [--out DIR]

Each setting trains a fresh LoRA adapter on the same gold episodes (same order where the sampler allows) for
``--steps`` optimizer steps of 4 episodes and reports episode tokens per second (prompt, observations and model
turns, padding excluded) after one warm-up step. The settings add one change at a time:
- ``trl-defaults``: r = 64, random batches, gradient checkpointing and TRL's fused LM head (its defaults);
- ``+group_by_length``: batches of episodes of similar length, so little padding;
- ``+no-checkpointing``: no recomputed forward (a 135M model fits in memory without it);
- ``+full-loss``: the model's own cross-entropy over every position's logits instead of the fused LM head;
- ``+trained-positions`` (run_sft.py): the LM head only at the positions trained on;
- ``r16``: run_sft.py's rank 16 (the shipped adapters), in the precision run_sft.py picks for this machine, then in
  the other one (float32 where bf16 autocast is the pick, bf16 autocast where float32 is: slow unless native);
- ``r16, 2 at once`` and ``r16, 1 at once``: the same 4 episodes a step, as 2 batches of 2 or 4 of 1 with their
  gradients accumulated (less padding and memory; on a CPU a batch of one long episode already fills the cores).
``--only`` runs some of the settings by name.
Each row is written as soon as it is measured, so a run cut short keeps what it measured.
Results go to benchmarks/results/sft_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import TrainerCallback  # noqa: E402

from training.precision import bf16_support, device_defaults  # noqa: E402
from training.run_sft import main as run_sft  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SETTINGS = {
    "trl-defaults": ["--lora_r", "64", "--lora_alpha", "128", "--train_sampling_strategy", "random",
                     "--gradient_checkpointing", "true", "--loss", "trl"],
    "+group_by_length": ["--lora_r", "64", "--lora_alpha", "128", "--gradient_checkpointing", "true",
                         "--loss", "trl"],
    "+no-checkpointing": ["--lora_r", "64", "--lora_alpha", "128", "--loss", "trl"],
    "+full-loss": ["--lora_r", "64", "--lora_alpha", "128", "--loss", "full"],
    "+trained-positions": ["--lora_r", "64", "--lora_alpha", "128"],
    "r16 (run_sft.py)": [],
    "r16, 2 at once": ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2"],
    "r16, 1 at once": ["--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "4"],
}  # fmt: skip


class StepTimer(TrainerCallback):
    """Wall time and episode tokens (``state.num_input_tokens_seen``, padding excluded) of each optimizer step."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int]] = []
        self._started, self._seen = 0.0, 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started, self._seen = time.perf_counter(), state.num_input_tokens_seen

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append((time.perf_counter() - self._started, state.num_input_tokens_seen - self._seen))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="an embedded base (smollm2, qwen0.5b) or a model folder")
    parser.add_argument("--episodes", default="runs/gold/parallel.jsonl", help="gold episodes tokenized for --model")
    parser.add_argument("--name", default="sft_speed", help="results file name under --out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--max-length", type=int, help="the --max-length the episodes were built with (default: run_sft.py's)"
    )
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "sft-speed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--only", nargs="+", metavar="SETTING", help="run only these settings (names as in the table)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1 timed step, got {args.steps}")

    other = (
        ("r16, float32", ["--bf16", "false"])
        if device_defaults()["bf16"]
        else ("r16, bf16 autocast", ["--bf16", "true"])
    )
    settings = dict([*SETTINGS.items(), other])
    unknown = sorted(set(args.only or ()) - set(settings))
    if unknown:
        parser.error(f"--only: no setting named {unknown}; expected some of {sorted(settings)}")
    max_length = ["--max_length", str(args.max_length)] if args.max_length else []  # else run_sft.py's default
    rows = []
    for name, flags in settings.items():
        if args.only and name not in args.only:
            continue
        timer = StepTimer()
        run_sft(
            ["--model_name_or_path", args.model, "--episodes", args.episodes,
             "--output_dir", str(args.run_dir / name.strip("+").replace(",", "").replace(" ", "-")),
             "--max_steps", str(args.steps + 1), "--save_strategy", "no", "--report_to", "none", "--seed", "0",
             "--logging_steps", "1000", "--include_num_input_tokens_seen", "true", *max_length, *flags],
            callbacks=[timer],
        )  # fmt: skip
        timed = timer.steps[1:]  # the first step warms up
        seconds, tokens = sum(s for s, _ in timed), sum(t for _, t in timed)
        rows.append({"setting": name, "flags": flags, "tokens_per_s": tokens / seconds,
                     "seconds_per_step": seconds / len(timed), "tokens_per_step": tokens / len(timed)})  # fmt: skip
        print(rows[-1], flush=True)
        write(rows, args)


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """The results so far: ``NAME.json`` and ``NAME.md`` under ``--out``."""
    import torch

    base = rows[0]["tokens_per_s"]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({bf16_support()})"
    result = {"command": shlex.join(["python", "benchmarks/sft_speed.py", *sys.argv[1:]]), "episodes": args.episodes,
              "model": args.model, "device": device, "steps": args.steps, "rows": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# SFT throughput ({args.model} + LoRA on {device}, optimizer steps of 4 gold episodes)",
        "",
        f"`{result['command']}` — {args.steps} timed steps per setting after one warm-up step, same episodes.",
        "",
        f"| setting | episode tokens/s | × {rows[0]['setting']} | s/step | tokens/step |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f} | "
            f"{r['seconds_per_step']:.1f} | {r['tokens_per_step']:.0f} |"
        )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
