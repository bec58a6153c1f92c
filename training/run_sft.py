"""Supervised warm start on gold trajectories (TRL ``SFTTrainer``), before GRPO.

    python training/gold.py --mode parallel --topk 2 --per-source-class 40    # runs/gold/parallel.jsonl
    python training/run_sft.py --config training/configs/sft_parallel.yaml   # runs/sft-parallel/final
    python training/run_sft.py --episodes runs/gold/parallel.jsonl --output_dir runs/sft-parallel --lora_r 16

Each episode is pre-tokenized exactly as an RL rollout (``training/gold.py``): ``input_ids`` is the prompt,
then the model turns and observations in order; ``labels`` are −100 on the prompt and on every observation
token, so the loss falls on the model's own turns only (TRL uses given ``labels`` as they are). Batches hold
episodes of similar length (``train_sampling_strategy="group_by_length"``), so padding is small; there is no
gradient checkpointing (TRL's default recomputes every forward; a 135M model fits without it), and the loss is
the model's own cross-entropy (``--plain_loss false`` for TRL's fused LM head, which projects only the trained
positions but was slower on this CPU). Padding-free packing (``--packing true``) needs flash attention to pay:
with SDPA on a CPU it attends over the whole packed row. benchmarks/sft_speed.py measures these side by side.
LoRA on every linear layer (``--use_lora false`` for full fine-tuning); on the GPU when torch sees one, with bf16
autocast, else on the CPU, in bf16 only where it has native bf16. Every field of ``SFTArguments`` and TRL's
``SFTConfig`` is a flag or a key of the ``--config`` YAML; ``--resume_from_checkpoint`` continues a run.
``OUTPUT_DIR/final`` holds the adapter, its weights in bfloat16, with the tokenizer.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `training` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ps_agent.llms import EMBEDDED_BASE, EMBEDDED_MODEL
from ps_agent.retrieval.encoders import resolve_dtype
from training.gold import sft_example
from training.run_grpo import model_path

logger = logging.getLogger("run_sft")

DEFAULTS = {
    "output_dir": "runs/sft-embedded",
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "learning_rate": 1e-3,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.03,
    "max_length": 896,
    "gradient_checkpointing": False,  # TRL's default recomputes every forward: a 135M model fits without it
    "packing": False,
    "train_sampling_strategy": "group_by_length",
    "logging_steps": 5,
    "save_steps": 50,
    "save_total_limit": 2,
    "report_to": ["tensorboard"],
    "seed": 0,
    "dataset_num_proc": 1,
}


@dataclass
class SFTArguments:
    """What to fine-tune on which episodes (TRL's ``SFTConfig`` holds the rest)."""

    model_name_or_path: str = field(
        default="smollm2", metadata={"help": "smollm2 (the embedded base model, untrained) or a model folder"}
    )
    episodes: str = field(default="runs/gold/parallel.jsonl", metadata={"help": "gold episodes (training/gold.py)"})
    limit: int | None = field(default=None, metadata={"help": "use only the first N episodes"})
    use_lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    save_dtype: str = field(default="bfloat16", metadata={"help": "dtype of the saved adapter (float32, bfloat16)"})
    plain_loss: bool = field(
        default=True,
        metadata={"help": "the model's own cross-entropy instead of TRL's fused LM head (faster on CPUs, see docs)"},
    )


def load_examples(path: str | Path, limit: int | None = None) -> list[dict[str, list[int]]]:
    """``input_ids``/``labels`` rows from a gold episode file; a bad line names its file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"episodes file not found: {path} (expected the jsonl written by training/gold.py)")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(sft_example(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number}: not a gold episode ({type(exc).__name__}: {exc}); expected a JSON object "
                    "with prompt_ids, completion_ids and env_mask"
                ) from exc
            if limit and len(rows) >= limit:
                break
    if not rows:
        raise ValueError(f"episodes file is empty: {path}")
    return rows


def device_defaults() -> dict[str, bool]:
    """Where to train unless ``--use_cpu``/``--bf16`` say otherwise: the GPU when torch sees one, with bf16
    autocast; else the CPU, in bf16 only where it computes it natively (AMX / AVX512-BF16): elsewhere autocast
    falls back to a reference GEMM far slower than float32."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"use_cpu": device == "cpu", "bf16": resolve_dtype("auto", device) == "bfloat16"}


def parse(argv: list[str] | None = None):
    """``(SFTArguments, SFTConfig)`` from flags and ``--config``, over this script's defaults."""
    from trl import SFTConfig, TrlParser

    parser = TrlParser((SFTArguments, SFTConfig))
    # Decided before parsing, as TrainingArguments derives its mixed-precision state when it is built.
    parser.set_defaults(**DEFAULTS, **device_defaults())
    args, config = parser.parse_args_and_config(args=argv)[:2]
    return args, config


def main(argv: list[str] | None = None, callbacks: list | None = None) -> Path:
    """Parse flags (and ``--config``), train, save ``OUTPUT_DIR/final``; ``callbacks`` go to the trainer."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    args, config = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logger.info("training in %s", "bfloat16 autocast" if config.bf16 else "float32")

    path = model_path(args.model_name_or_path)
    rows = load_examples(args.episodes, args.limit)
    too_long = sum(len(r["input_ids"]) > config.max_length for r in rows)
    if too_long:
        raise ValueError(
            f"{too_long} episodes are longer than max_length={config.max_length}: packing would cut them; "
            "build the episodes with the same --max-length (training/gold.py) or raise max_length"
        )
    logger.info("%d episodes, %d tokens, %d trained", len(rows), *_token_counts(rows))
    peft_config = None
    if args.use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=args.lora_target_modules.split(","),
            task_type="CAUSAL_LM",
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    trainer_class = _plain_loss_trainer() if args.plain_loss else SFTTrainer
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_state()  # OUTPUT_DIR/trainer_state.json: the whole loss history
    final = Path(config.output_dir) / "final"
    if peft_config is not None:
        base = EMBEDDED_BASE if args.model_name_or_path == EMBEDDED_MODEL else path  # portable for the embedded
        save_adapter(trainer.model, final, getattr(torch, args.save_dtype), base)
    else:
        trainer.save_model(str(final))
    tokenizer.save_pretrained(final)
    logger.info("saved the trained %s to %s", "adapter" if peft_config else "model", final)
    return final


def _plain_loss_trainer():
    from transformers import Trainer
    from trl import SFTTrainer

    class PlainLossSFTTrainer(SFTTrainer):
        """``SFTTrainer`` with the model's own cross-entropy over full logits. TRL's fused LM head projects
        only the labelled positions, but in tiles whose backward has no Triton kernel on a CPU; here the
        plain loss was ~25% faster in unsaved development runs (benchmarks/sft_speed.py measures it)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    return PlainLossSFTTrainer


def save_adapter(model, out: Path, dtype, base: str) -> None:
    """Save a PEFT adapter with its weights in ``dtype`` (bfloat16 halves the file; loading upcasts) and
    ``base`` as its base model (what ``ps_agent.llms.load_adapter_model`` checks)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = model.peft_config["default"]
    config.base_model_name_or_path = str(base)
    config.save_pretrained(out)
    state = {k: v.detach().to(dtype).contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(state, out / "adapter_model.safetensors", metadata={"format": "pt"})


def _token_counts(rows: list[dict[str, list[int]]]) -> tuple[int, int]:
    return sum(len(r["input_ids"]) for r in rows), sum(sum(t != -100 for t in r["labels"]) for r in rows)


if __name__ == "__main__":
    main()
