"""What the machine computes natively: the one bf16 capability query, below the encoders and the trainers."""

from __future__ import annotations


def cpu_bf16_native() -> bool:
    """The CPU computes bf16 matrix products natively (AMX or AVX512-BF16): oneDNN's own capability query.
    Elsewhere bf16 runs on slower fallback kernels and gains nothing over float32."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
