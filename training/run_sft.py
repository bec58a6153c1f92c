"""Supervised warm start on gold trajectories (TRL ``SFTTrainer``), before GRPO.

    python training/gold.py --mode parallel --topk 2 --per-source-class 40    # runs/gold/parallel.jsonl
    python training/run_sft.py --config training/configs/sft_parallel.yaml   # runs/sft-parallel/final
    python training/run_sft.py --config training/configs/sft_qwen_parallel.yaml   # the shipped qwen0.5b adapter
    python training/run_sft.py --episodes runs/gold/parallel.jsonl --output_dir runs/sft-parallel --lora_r 16

Each episode is pre-tokenized exactly as an RL rollout (``training/gold.py``): ``input_ids`` is the prompt,
then the model turns and observations in order; ``labels`` are −100 on the prompt and on every observation
token, so the loss falls on the model's own turns only (TRL uses given ``labels`` as they are). Batches hold
episodes of similar length (``train_sampling_strategy="group_by_length"``), so padding is small; there is no
gradient checkpointing (TRL's default recomputes every forward; a 0.5B model fits without it), and the loss
projects through the LM head only the positions it trains on (``--loss full``: the model's own loss over every
position; ``--loss trl``: TRL's fused LM head, slower on a CPU, and the only one that takes packing and TRL's other
loss types, refused with the others). benchmarks/sft_speed.py measures these side by side.
LoRA on every linear layer (``--use_lora false`` for full fine-tuning); on the GPU when torch sees one, with bf16
autocast, else on the CPU, in bf16 only where it has native bf16. Every field of ``SFTArguments`` and TRL's
``SFTConfig`` is a flag or a key of the ``--config`` YAML; ``--resume_from_checkpoint`` continues a run, on
the same episode file only (each checkpoint records its sha256).
``OUTPUT_DIR/final`` holds the adapter, its weights in bfloat16, with the tokenizer.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `training` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ps_agent.llms import EMBEDDED_BASES, model_path, peft_adapter
from training.arguments import MAX_LENGTH, ModelArguments, new_lora
from training.checkpoints import (
    checked_resume,
    episodes_record,
    epoch_seeded,
    record_in_checkpoints,
    save_adapter_weights,
)
from training.precision import device_defaults, skip_nonfinite_steps
from training.trained_positions import next_token_loss

logger = logging.getLogger("run_sft")

DEFAULTS = {
    "output_dir": "runs/sft-embedded",
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "learning_rate": 1e-3,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.03,
    "max_length": MAX_LENGTH,  # as gold.py builds by default, so that no episode is cut
    "gradient_checkpointing": False,  # TRL's default recomputes every forward: a 0.5B model fits without it
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
class SFTArguments(ModelArguments):
    """What to fine-tune on which episodes (TRL's ``SFTConfig`` holds the rest)."""

    episodes: str = field(default="runs/gold/parallel.jsonl", metadata={"help": "gold episodes (training/gold.py)"})
    limit: int | None = field(default=None, metadata={"help": "use only the first N episodes"})
    save_dtype: str = field(default="bfloat16", metadata={"help": "dtype of the saved adapter (float32, bfloat16)"})
    loss: str = field(
        default="trained_positions",
        metadata={
            "help": "trained_positions (the LM head only where the loss falls), full (the model's own loss over "
            "every position's logits) or trl (TRL's fused LM head); benchmarks/sft_speed.py compares them"
        },
    )


def _out_of_vocabulary(ids: list[Any], vocab_size: int | None) -> Any:
    """The first id that is not a token id of a ``vocab_size`` vocabulary (any non-integer), or None."""
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or token < 0 or (vocab_size and token >= vocab_size):
            return token
    return None


def sft_example(ep: dict[str, Any]) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` for SFT: the loss falls on the model's turns only, −100 on the prompt
    and on every observation token."""
    labels = [-100] * len(ep["prompt_ids"]) + [
        t if keep else -100 for t, keep in zip(ep["completion_ids"], ep["env_mask"], strict=True)
    ]
    return {"input_ids": ep["prompt_ids"] + ep["completion_ids"], "labels": labels}


def check_tokenizer(episodes: str | Path, model: str | Path) -> None:
    """Refuse episodes that ``gold.py`` built with another model's tokenizer, where their summary says which: a
    smaller model's ids fit a larger vocabulary, so they would train on the wrong tokens and chat template."""
    summary = Path(episodes).with_suffix(".summary.json")
    built = json.loads(summary.read_text()).get("tokenizer") if summary.is_file() else None
    if built is not None and built != Path(model).name:
        raise ValueError(
            f"{episodes} holds token ids of {built}'s tokenizer ({summary}), not of {Path(model).name}'s: rebuild it "
            "with training/gold.py --model for this model"
        )


def load_examples(
    path: str | Path, limit: int | None = None, vocab_size: int | None = None
) -> list[dict[str, list[int]]]:
    """``input_ids``/``labels`` rows from a gold episode file; a bad line (not an episode, turns and mask of
    different lengths, a token id outside the model's ``vocab_size``) names its file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"episodes file not found: {path} (expected the jsonl written by training/gold.py)")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = sft_example(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number}: not a gold episode ({type(exc).__name__}: {exc}); expected a JSON object "
                    "with prompt_ids, completion_ids and an env_mask of the completion's length"
                ) from exc
            bad = _out_of_vocabulary(row["input_ids"], vocab_size)
            if bad is not None:
                raise ValueError(
                    f"{path}:{number}: token id {bad!r} is not in the model's vocabulary of {vocab_size}: expected "
                    "episodes built with this model's tokenizer (training/gold.py --model)"
                )
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    if not rows:
        raise ValueError(f"episodes file is empty: {path}")
    return rows


def parse(argv: list[str] | None = None):
    """``(SFTArguments, SFTConfig)`` from flags and ``--config``, over this script's defaults."""
    from trl import SFTConfig, TrlParser

    parser = TrlParser((SFTArguments, SFTConfig))
    # Decided before parsing, as TrainingArguments derives its mixed-precision state when it is built.
    parser.set_defaults(**DEFAULTS, **device_defaults())
    args, config = parser.parse_args_and_config(args=argv)[:2]
    if config.include_num_input_tokens_seen == "all":  # its parser takes only a bool: count episode tokens, not padding
        config.include_num_input_tokens_seen = "non_padding"
    return args, config


def main(argv: list[str] | None = None, callbacks: list | None = None) -> Path:
    """Parse flags (and ``--config``), train, save ``OUTPUT_DIR/final``; ``callbacks`` go to the trainer."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    # before parse, which says the CPU's precision once
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, config = parse(argv)
    logger.info("training in %s", "bfloat16 autocast" if config.bf16 else "float32")
    _check_loss(args.loss, config)

    path = model_path(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    check_tokenizer(args.episodes, path)
    rows = load_examples(args.episodes, args.limit, vocab_size=len(tokenizer))
    too_long = sum(len(r["input_ids"]) > config.max_length for r in rows)
    if too_long:
        raise ValueError(
            f"{too_long} episodes are longer than max_length={config.max_length}: TRL would cut them; "
            "build the episodes with the same --max-length (training/gold.py) or raise max_length"
        )
    logger.info("%d episodes, %d tokens, %d trained", len(rows), *_token_counts(rows))
    step_size = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size
    episodes = episodes_record(args.episodes, args.limit, config.seed, step_size)
    resume = checked_resume(config.output_dir, config.resume_from_checkpoint, path, episodes)  # before loading
    peft_config = new_lora(args)
    if args.init_adapter:
        model = peft_adapter(args.init_adapter, path, trainable=True)  # refused when trained on another base
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    loss = args.loss
    if loss == "trained_positions" and config.world_size > 1:  # it calls the decoder past DDP's wrapper
        logger.warning(
            "--loss trained_positions runs on one process: these %d train with --loss full, equal to it (the "
            "model's own loss; DDP syncs gradients only through the model's forward)",
            config.world_size,
        )
        loss = "full"
    trainer_class = epoch_seeded(SFTTrainer if loss == "trl" else _own_loss_trainer(loss))
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[*(callbacks or []), record_in_checkpoints(episodes), skip_nonfinite_steps()],
    )
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_state()  # OUTPUT_DIR/trainer_state.json: the whole loss history
    final = Path(config.output_dir) / "final"
    if peft_config is not None or args.init_adapter:
        embedded = EMBEDDED_BASES.get(args.model_name_or_path)
        base = embedded.folder if embedded else path  # an embedded base is recorded by name: portable
        save_adapter(trainer.model, final, getattr(torch, args.save_dtype), base)
    else:
        trainer.save_model(str(final))
    tokenizer.save_pretrained(final)
    logger.info("saved the trained %s to %s", "adapter" if peft_config or args.init_adapter else "model", final)
    return final


def _check_loss(loss: str, config: Any) -> None:
    """Refuse what ``loss`` would not apply. Our losses (``trained_positions``, ``full``) take one unpadded
    episode a row and TRL's cross-entropy (``loss_type nll``); only ``trl``, TRL's own loss, knows packing's
    position ids and the other loss types."""
    if loss not in ("trained_positions", "full", "trl"):
        raise ValueError(f"--loss must be trained_positions, full or trl, got {loss!r}")
    if loss == "trl":
        return
    ignored = []
    if config.packing or config.padding_free:
        ignored.append("--packing / --padding_free")
    if config.loss_type != "nll":
        ignored.append(f"--loss_type {config.loss_type}")
    if loss == "trained_positions" and config.label_smoothing_factor:
        ignored.append("--label_smoothing_factor")
    if ignored:
        raise ValueError(f"--loss {loss} would ignore {', '.join(ignored)}: pass --loss trl with them, or drop them")


def _own_loss_trainer(loss: str):
    from transformers import Trainer
    from trl import SFTTrainer

    class OwnLossSFTTrainer(SFTTrainer):
        """``SFTTrainer`` with one of our losses. ``trained_positions`` projects through the LM head only the
        positions trained on (the model's own turns, about a fifth of an episode): with Qwen2.5's 152k-token
        vocabulary the full logits are most of a step. ``full`` is the model's own cross-entropy over every
        position. TRL's fused LM head also projects only trained positions, in tiles whose backward has no
        Triton kernel on a CPU."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if loss == "full":
                return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
            # the decoder is called past the model's forward, which Accelerate wraps in the run's autocast:
            # without this, bf16 runs trained this loss in float32 (half the speed of the full loss on a CPU)
            with self.accelerator.autocast():
                return next_token_loss(model, inputs, num_items_in_batch)

    return OwnLossSFTTrainer


def save_adapter(model, out: Path, dtype, base: str) -> None:
    """Save a PEFT adapter with its weights in ``dtype`` (bfloat16 halves the file; loading upcasts) and
    ``base`` as its base model (what ``ps_agent.llms.load_adapter_model`` checks)."""
    from peft import get_peft_model_state_dict

    save_adapter_weights(get_peft_model_state_dict(model), out, dtype)
    config = model.peft_config["default"]
    config.base_model_name_or_path = str(base)
    config.save_pretrained(out)


def _token_counts(rows: list[dict[str, list[int]]]) -> tuple[int, int]:
    return sum(len(r["input_ids"]) for r in rows), sum(sum(t != -100 for t in r["labels"]) for r in rows)


if __name__ == "__main__":
    main()
