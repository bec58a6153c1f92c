"""Which checkpoint a run resumes from: ``--resume_from_checkpoint True`` means the newest *complete* one.

The Trainer writes a checkpoint's weights, optimizer and RNG state first and its ``trainer_state.json`` last,
so a folder whose state file is missing or torn, or whose weights cannot be read, was cut off mid-save (a
SIGTERM, a full disk): it is skipped, with the reason logged, and the run resumes from the one before it.

A resumed run skips the batches it has trained on by position, so it must read the same episodes in the same order:
an SFT checkpoint records its episode file's sha256 (``EPISODES``), and a resume on other episodes is refused; a
GRPO sampler shuffles each epoch from its seed and the epoch (``epoch_seeded``). An
adapter checkpoint records its base model, and a resume on another base is refused with both names (PEFT would
fail later, on mismatched shapes, or not at all where the shapes agree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from ps_agent.llms.adapters import same_base

logger = logging.getLogger(__name__)

_STEP = re.compile(r"^checkpoint-(\d+)$")
WEIGHTS = ("adapter_model.safetensors", "model.safetensors")
SHARDED = "model.safetensors.index.json"  # a full model saved in shards
#: the file of a checkpoint that names the episodes it was trained on
EPISODES = "episodes.json"


def epoch_seeded(trainer_class: type) -> type:
    """``trainer_class`` (a ``GRPOTrainer`` or an SFT trainer) whose sampler shuffles epoch ``e`` from ``seed + e``.
    TRL's ``RepeatSampler`` draws every epoch's order from one generator seeded once, and transformers'
    ``LengthGroupedSampler`` (SFT's ``group_by_length``) from the global RNG: a resumed run, which builds a new
    sampler, replayed epoch 0's order past the first epoch, training some episodes twice and others never.

    The sampler the dataloader iterates is seeded here at the start of each epoch: the Trainer's own ``set_epoch``
    does not reach it in the epoch a run resumes in on several processes (accelerate's ``SkipBatchSampler`` over its
    ``BatchSamplerShard``), and that epoch replayed epoch 0's order."""

    class EpochSeeded(trainer_class):
        def _get_train_sampler(self, dataset: Any = None) -> Any:
            sampler = super()._get_train_sampler(dataset)
            if not hasattr(sampler, "generator") or hasattr(sampler, "set_epoch") or not getattr(sampler, "shuffle", 1):
                return sampler
            if hasattr(sampler, "seed"):  # TRL's RepeatSampler: its own generator and seed
                seed = sampler.seed or 0
            else:
                seed = self.args.seed
                sampler.generator = torch.Generator()
            sampler.set_epoch = lambda epoch: sampler.generator.manual_seed(seed + epoch)
            return sampler

        def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
            sampler = iterated_sampler(kwargs["train_dataloader"])  # the Trainer passes its arguments by name
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(kwargs["epoch"])
            return super()._run_epoch(*args, **kwargs)

    EpochSeeded.__name__ = EpochSeeded.__qualname__ = trainer_class.__name__
    return EpochSeeded


def iterated_sampler(dataloader: Any) -> Any:
    """The sampler a dataloader draws its indices from, under accelerate's batch sampler wrappers (its
    ``BatchSamplerShard`` on several processes; the ``SeedableRandomSampler`` it puts in a ``RandomSampler``'s
    place is the one found)."""
    batches = dataloader.batch_sampler
    while hasattr(batches, "batch_sampler"):
        batches = batches.batch_sampler
    return getattr(batches, "sampler", None)


def episodes_record(
    path: str | Path, limit: int | None = None, seed: int | None = None, step_size: int | None = None
) -> dict[str, Any]:
    """What names the episodes of a run for its checkpoints: the file's path and the sha256 of its bytes, and the
    run's ``--limit`` (its first N episodes), ``--seed`` (their order) and episodes per optimizer step (a resume
    skips ``global_step × step_size`` of them)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return run_record(str(path), digest, limit, seed, step_size)


def rows_record(
    source: str, rows: list[dict[str, Any]], seed: int | None = None, step_size: int | None = None
) -> dict[str, Any]:
    """``episodes_record`` for rows from any source (a GRPO run's questions: a file, ``builtin``, ``hf:NAME``):
    the sha256 of the rows themselves, after any ``--limit``, and the questions a step takes."""
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode())
    return run_record(source, digest, None, seed, step_size)


def run_record(source: str, digest: Any, limit: int | None, seed: int | None, step_size: int | None) -> dict[str, Any]:
    """The record both kinds of run keep; ``step_size`` only where the run states it (older checkpoints lack it,
    and are checked without it)."""
    kept = {"episodes": source, "sha256": digest.hexdigest(), "limit": limit, "seed": seed}
    return kept | ({"step_size": step_size} if step_size is not None else {})


def record_in_checkpoints(record: dict[str, Any]) -> Any:
    """A Trainer callback that writes ``record`` (the episodes trained on) into each checkpoint it follows."""
    from transformers import TrainerCallback

    class RecordEpisodes(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                (folder / EPISODES).write_text(json.dumps(record) + "\n")

    return RecordEpisodes()


def check_same_episodes(checkpoint: str | Path, record: dict[str, Any]) -> None:
    """Refuse to resume ``checkpoint`` on episodes other than those it recorded, or on another ``--limit`` or
    ``--seed`` (checkpoints made before those were recorded are checked on the file alone); one that recorded
    nothing (made before checkpoints did) is resumed with a warning."""
    try:
        saved = json.loads((Path(checkpoint) / EPISODES).read_text())
    except FileNotFoundError:
        logger.warning("%s does not record its episodes: resuming on %s unchecked", checkpoint, record["episodes"])
        return
    if saved.get("sha256") != record["sha256"]:
        raise SystemExit(
            f"{checkpoint} was trained on {saved.get('episodes')} (sha256 {saved.get('sha256')}), but the episodes "
            f"given are {record['episodes']} (sha256 {record['sha256']}): a resume skips batches by position, so "
            "it needs the same file; rebuild it with the command that made it (the run's config says which)"
        )
    for key in ("limit", "seed"):
        if key in saved and saved[key] != record[key]:
            raise SystemExit(
                f"{checkpoint} was trained with --{key} {saved[key]}, but this run has --{key} {record[key]}: a "
                f"resume skips batches by position, so it needs the same episodes in the same order; pass --{key} "
                f"{saved[key]}"
            )
    if "step_size" in saved and "step_size" in record and saved["step_size"] != record["step_size"]:
        raise SystemExit(
            f"{checkpoint} was trained on {saved['step_size']} episodes a step, but this run takes "
            f"{record['step_size']} (--per_device_train_batch_size × --gradient_accumulation_steps × processes; GRPO "
            "counts questions, that ÷ --num_generations): a resume skips that many per step already trained, so it "
            "needs the same; pass the settings of its config"
        )


def save_adapter_weights(tensors: dict, out: Path, dtype) -> Path:
    """Write adapter ``tensors`` to ``out/adapter_model.safetensors``, each floating-point one cast to ``dtype``;
    weights that hold a NaN or an infinity are refused before anything is written (a diverged run's adapter would
    load, and answer nothing)."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(dtype).contiguous() if v.is_floating_point() else v for k, v in tensors.items()}
    nonfinite = [k for k, v in state.items() if not v.isfinite().all()]
    if nonfinite:
        raise FloatingPointError(
            f"not saving the adapter to {out}: {len(nonfinite)} of its {len(state)} tensors hold NaN or inf "
            f"(first: {nonfinite[0]}); expected finite weights: resume from a checkpoint before the run diverged"
        )
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, out / WEIGHTS[0], metadata={"format": "pt"})
    return out / WEIGHTS[0]


def incomplete(folder: Path) -> str | None:
    """Why ``folder`` is not a checkpoint to resume from, or None when it is whole."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
    except FileNotFoundError:
        return f"{folder} holds no trainer_state.json (a save cut off before its end, or not a checkpoint)"
    except ValueError as exc:
        return f"trainer_state.json is torn ({exc})"
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return "trainer_state.json has no global_step"
    from safetensors import safe_open

    present = [folder / name for name in WEIGHTS if (folder / name).is_file()]
    if not present and not (folder / SHARDED).is_file():
        return f"{folder} holds no weights ({' or '.join(WEIGHTS)}): a save cut off before its end"
    for weights in present:
        try:
            with safe_open(weights, framework="pt") as opened:
                opened.keys()
        except Exception as exc:  # safetensors' own error for a torn header
            return f"{weights.name} cannot be read ({type(exc).__name__})"
    return None


def checked_resume(
    output_dir: str | Path, resume_from_checkpoint: str | bool | None, base: str | Path | None, record: dict[str, Any]
) -> str | None:
    """The checkpoint a run resumes from (``resume_checkpoint``), refused when it is an adapter of another ``base``
    or was trained on other episodes or questions (``record``: ``episodes_record`` or ``rows_record``)."""
    resume = resume_checkpoint(output_dir, resume_from_checkpoint, base)
    if resume is not None:
        check_same_episodes(resume, record)  # a resume skips the batches it trained on, by position
    return resume


def check_same_base(checkpoint: str | Path, base: str | Path) -> None:
    """Refuse to resume the adapter ``checkpoint`` on a base model other than the one it records
    (``ps_agent.llms.adapters.same_base``, as a shipped adapter's is checked); a full-model checkpoint, which records
    no adapter base, passes."""
    config = Path(checkpoint) / "adapter_config.json"
    if not config.is_file():
        return
    recorded = json.loads(config.read_text()).get("base_model_name_or_path")
    if recorded and not same_base(recorded, base):
        raise SystemExit(
            f"{checkpoint} is an adapter of base model {recorded!r}, but this run trains {str(base)!r}: resume "
            "it with the --model_name_or_path it was trained on, or start afresh in another --output_dir"
        )


def checkpoints(output_dir: str | Path) -> list[Path]:
    """``OUTPUT_DIR/checkpoint-N`` folders, newest first."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and _STEP.match(p.name)]
    return sorted(folders, key=lambda p: int(_STEP.match(p.name).group(1)), reverse=True)  # type: ignore[union-attr]


def resume_checkpoint(
    output_dir: str | Path, resume_from_checkpoint: str | bool | None, base: str | Path | None = None
) -> str | None:
    """The checkpoint to hand ``Trainer.train``: None for a fresh run (refused in an ``output_dir`` that holds
    checkpoints), a named folder once checked, or for ``True`` the newest complete one in ``output_dir`` (each newer
    incomplete one skipped with its reason); with ``base``, an adapter checkpoint of another base model is
    refused."""
    value = resume_from_checkpoint
    if value in (None, False, "", "False", "false", "None"):
        earlier = checkpoints(output_dir)
        if earlier:  # the Trainer would save beside them, and a later resume would pick the newest step: theirs
            raise SystemExit(
                f"{output_dir} holds an earlier run's checkpoints ({', '.join(p.name for p in earlier[:3])}"
                f"{', …' if len(earlier) > 3 else ''}): pass --resume_from_checkpoint True to continue that run, "
                "or start afresh in another --output_dir"
            )
        return None
    if value not in (True, "True", "true"):
        chosen = Path(str(value))
        problem = incomplete(chosen)
        if problem:
            raise SystemExit(f"--resume_from_checkpoint {chosen}: {problem}; expected a whole OUTPUT_DIR/checkpoint-N")
    else:
        chosen = next((folder for folder in checkpoints(output_dir) if _whole(folder)), None)
        if chosen is None:
            raise SystemExit(
                f"--resume_from_checkpoint True: {output_dir} holds no complete checkpoint (checkpoint-N with its "
                "weights and trainer_state.json); run without it to start afresh"
            )
    if base is not None:
        check_same_base(chosen, base)
    return str(chosen)


def _whole(folder: Path) -> bool:
    """Whether ``folder`` is a whole checkpoint; an incomplete one is logged with its reason."""
    problem = incomplete(folder)
    if problem:
        logger.warning("skipping %s: %s", folder, problem)
    return problem is None
