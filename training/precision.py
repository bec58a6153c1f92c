"""Where and in what precision training runs: on the GPU when torch sees one, under bf16 autocast; else on the
CPU, under bf16 autocast only where the CPU computes bf16 natively (Intel AMX or AVX512-BF16): elsewhere it gains
nothing (1.03x float32 on an AVX2 CPU, benchmarks/results/sft_speed.md). Said once in the log; ``--use_cpu`` and
``--bf16`` override (benchmarks/sft_speed.py measures both precisions side by side)."""

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
