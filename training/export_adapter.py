"""A training checkpoint's LoRA adapter as a folder to ship or commit: its weights in bfloat16, its config and
trainer state, and none of the optimizer, scheduler or RNG state (for the 0.5B policy's r = 16 adapter, 17.6 MB
in place of 106 MB). The agent loads it as ``hf:OUT`` (upcast and merged into the float32 base), ``run_grpo.py
--init_adapter OUT`` continues it with a fresh optimizer, and ``benchmarks/grpo_runs.py --run NAME=OUT`` reads its
curves.

    python training/export_adapter.py runs/grpo-qwen-parallel-v5/checkpoint-9 runs/grpo-qwen-parallel-v5/step-9-bf16
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.checkpoints import WEIGHTS, incomplete, save_adapter_weights  # noqa: E402

ADAPTER = WEIGHTS[0]
#: what an exported folder keeps besides the weights (not the model card PEFT writes, a blank template)
KEPT = ("adapter_config.json", "trainer_state.json")


def export_adapter(checkpoint: str | Path, out: str | Path) -> Path:
    """Write ``checkpoint``'s adapter to ``out``, its floating-point tensors cast to bfloat16; a checkpoint cut off
    mid-save, one that holds no LoRA adapter, one whose weights hold NaN or inf, or an ``out`` that already exists
    is refused with the reason."""
    import torch
    from safetensors.torch import load_file

    checkpoint, out = Path(checkpoint), Path(out)
    problem = incomplete(checkpoint)
    if problem:
        raise SystemExit(f"{checkpoint}: {problem}; expected a whole OUTPUT_DIR/checkpoint-N")
    if not (checkpoint / ADAPTER).is_file() or not (checkpoint / "adapter_config.json").is_file():
        raise SystemExit(
            f"{checkpoint} holds no LoRA adapter ({ADAPTER} and adapter_config.json); a full-model checkpoint is "
            "shipped as it is"
        )
    if out.exists():
        raise SystemExit(f"{out} already exists: name a new folder, or remove it first")
    save_adapter_weights(load_file(checkpoint / ADAPTER), out, torch.bfloat16)
    for name in KEPT:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out / name)
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a training checkpoint folder, e.g. runs/RUN/checkpoint-9")
    parser.add_argument("out", help="the folder to write, e.g. runs/RUN/step-9-bf16")
    args = parser.parse_args(argv)
    out = export_adapter(args.checkpoint, args.out)
    size = (out / ADAPTER).stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB of bfloat16 adapter weights)")
    return out


if __name__ == "__main__":
    main()
