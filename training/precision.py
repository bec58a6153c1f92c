"""Where and in what precision training runs: on the GPU when torch sees one, under bf16 autocast; else on the
CPU, under bf16 autocast only where the CPU computes bf16 natively (Intel AMX or AVX512-BF16): elsewhere it gains
nothing (1.03x float32 on an AVX2 CPU, benchmarks/results/sft_speed.md). Said once in the log; ``--use_cpu`` and
``--bf16`` override (benchmarks/sft_speed.py measures both precisions side by side). A step whose gradients are
not finite is skipped rather than applied (``skip_nonfinite_steps``): one such update turns every LoRA weight into
NaN for the rest of the run."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from ps_agent.devices import cpu_bf16_native

logger = logging.getLogger(__name__)

_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_support() -> str:
    """A line on the CPU's bf16: ``native bf16 (amx_bf16)`` or ``no native bf16 (AVX2): float32``."""
    import torch

    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").is_file() else []
    named = [flag for flag in _BF16_FLAGS if flag in flags]
    if cpu_bf16_native():
        return f"native bf16 ({', '.join(named) or 'oneDNN'})"
    return f"no native bf16 ({torch.backends.cpu.get_cpu_capability()}): float32"


def device_defaults() -> dict[str, bool]:
    """``use_cpu`` and ``bf16`` for TRL's config unless flags say otherwise: the GPU with bf16 autocast, else the
    CPU, bf16 only where it is native."""
    import torch

    if torch.cuda.is_available():
        return {"use_cpu": False, "bf16": True}
    native = cpu_bf16_native()
    _say_once(bf16_support())
    return {"use_cpu": True, "bf16": native}


@functools.cache
def _say_once(line: str) -> None:
    logger.log(logging.WARNING if "no native" in line else logging.INFO, "training on the CPU: %s", line)


def skip_nonfinite_steps(patience: int = 3):
    """A trainer callback that skips each optimizer step whose gradients hold a NaN or an infinity (the step's
    gradients are dropped before the optimizer runs, so the weights stay as they were) and says so with the step;
    ``patience`` such steps in a row stop the run with a ``FloatingPointError``, the weights and the last
    checkpoint still finite. The Trainer itself applies such a step: clipping scales every gradient by a NaN norm.
    """
    import torch
    from transformers import TrainerCallback

    class SkipNonFiniteSteps(TrainerCallback):
        def __init__(self):
            self.skipped: list[int] = []
            self.in_a_row = 0

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if not grads or bool(torch.stack([g.isfinite().all() for g in grads]).all()):
                self.in_a_row = 0
                return
            step = state.global_step + 1
            for parameter in model.parameters():
                parameter.grad = None  # the optimizer leaves a parameter without a gradient as it is
            self.skipped.append(step)
            self.in_a_row += 1
            logger.warning(
                "step %d: gradients are not finite (NaN or inf); its update is skipped (%d skipped so far)",
                step,
                len(self.skipped),
            )
            if self.in_a_row >= patience:
                raise FloatingPointError(
                    f"steps {step - patience + 1}-{step}: {patience} steps in a row with non-finite gradients "
                    f"(learning rate {args.learning_rate:g}, {'bf16 autocast' if args.bf16 else 'float32'}); the "
                    f"weights are as after step {step - patience}: resume from the last checkpoint in "
                    f"{args.output_dir} with a lower --learning_rate, or train in float32 (--bf16 false)"
                )

        def on_train_end(self, args, state, control, **kwargs):
            if self.skipped:
                logger.warning("%d steps skipped for non-finite gradients: %s", len(self.skipped), self.skipped)

    return SkipNonFiniteSteps()
