"""Train a ParallelSearch agent with GRPO (TRL) on its own LangGraph trajectories.

    python training/run_grpo.py                          # short run on the embedded defaults
    python training/run_grpo.py --config training/configs/hotpotqa.yaml
    torchrun --nproc_per_node 2 training/run_grpo.py --max_steps 1 ...   # several processes (docs/training.md)

Every field of ``ParallelSearchArguments`` and of TRL's ``GRPOConfig`` is a flag (``--loss_type dr_grpo``,
``--beta 0.04``, ``--num_generations 8``, ``--resume_from_checkpoint RUN/checkpoint-10``, ...) or a key of
the YAML file given with ``--config``. It trains on the GPU (bf16 autocast) when torch sees one, else on the CPU
in bf16 where it computes bf16 natively, else float32 (``training/precision.py``); ``--use_cpu`` and ``--bf16``
choose otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState

if __package__ in (None, ""):  # run as a script: make `training` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ps_agent.configuration import describe
from ps_agent.llms import model_path, peft_adapter
from ps_agent.llms.vllm_server import VLLMServer, VLLMUnavailable
from ps_agent.questions import SHARED_DATA
from ps_agent.rewards import RewardWeights, choose_alpha, reward_functions
from ps_agent.trajectories import forget_steps_from, keep_previous_logs
from training.arguments import AgentArguments, ModelArguments, agent_config, new_lora
from training.checkpoints import checked_resume, epoch_seeded, record_in_checkpoints, rows_record
from training.data import load_questions, to_dataset
from training.plans import restore_corpora
from training.precision import device_defaults, skip_nonfinite_steps
from training.rollout import AgentRollout, RolloutSettings
from training.signals import sigterm_unwinds
from training.teacher import load_teacher, teacher_guided
from training.trained_positions import grpo_trainer_class

logger = logging.getLogger("run_grpo")

DEFAULTS = {
    "output_dir": "runs/grpo-embedded",
    "max_steps": 2,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "learning_rate": 1e-5,
    "logging_steps": 1,
    "save_steps": 1,
    "save_total_limit": 2,
    "max_completion_length": 2048,
    "mask_truncated_completions": True,  # an episode cut there is not trained on its uncut episode's reward
    "temperature": 1.0,
    "beta": 0.0,
    "report_to": ["tensorboard"],
    "seed": 0,
}


@dataclass
class ParallelSearchArguments(ModelArguments, AgentArguments):
    """What to train, on what, with which agent and rewards (TRL's ``GRPOConfig`` holds the rest). The agent's
    settings (``--mode``, ``--max_turns``, ``--topk``, ``--max_new_tokens``) are ``AgentConfig``'s own."""

    data: str = field(default="builtin", metadata={"help": "builtin, a question jsonl path, or hf:NAME[:SPLIT]"})
    limit: int | None = field(default=None, metadata={"help": "use only the first N questions"})
    part: str = field(
        default="all",
        metadata={"help": "all, train or validation: the questions of that part of the split evaluation reports on"},
    )
    corpus: str | None = field(default=None, metadata={"help": describe("corpus")})
    backend: str = field(
        default="hf",
        metadata={
            "help": "hf (the trainer's model generates), vllm-cpu (a vLLM server on this machine's CPU, started and "
            "stopped by this script, loaded with the newest adapter after every optimizer step), openai (such a "
            "server already running, --openai_base_url) or trl-vllm (TRL's vLLM integration)",
            "choices": ["hf", "vllm-cpu", "openai", "trl-vllm"],
        },
    )
    openai_base_url: str | None = field(default=None, metadata={"help": "the openai backend's server, .../v1"})
    dynamic_sampling: int = field(
        default=0,
        metadata={
            "help": "rounds of DAPO dynamic sampling per batch (0: off): groups whose rewards are all equal are "
            "replaced by groups of fresh questions whose rewards differ"
        },
    )
    oversample: int = field(default=2, metadata={"help": "fresh questions drawn per zero-variance group per round"})
    demonstration: bool | None = field(
        default=None,
        metadata={
            "help": "one-shot demonstration before the prompt (not in the paper); default: on from a base model "
            "(without it the untrained 135M model never emits a valid action, so every reward in a group is equal "
            "and GRPO has no signal), off when --init_adapter continues a policy that learnt the format"
        },
    )
    lambda_d: float = field(default=0.15, metadata={"help": "decomposition reward weight λd"})
    alpha: float | None = field(
        default=None,
        metadata={
            "help": "bonus multiplier α for decomposing parallelisable questions; default: min(3, 0.8 × the "
            "break-even value (1 - p)/p), the paper's 3 only where at most 21% should be split (docs/rewards.md)"
        },
    )
    lambda_s: float = field(default=0.35, metadata={"help": "search-count penalty weight λs"})
    lambda_f: float = field(default=0.1, metadata={"help": "format reward weight λf"})
    lm_head: str = field(
        default="scored",
        metadata={
            "help": "scored (the loss projects through the LM head only the tokens the model sampled) or trl "
            "(TRL's fused head, which on a CPU projects every position); benchmarks/grpo_backends.py compares them",
            "choices": ["scored", "trl"],
        },
    )
    teacher: str | None = field(
        default=None,
        metadata={
            "help": "teacher guidance (DGPO, training/teacher.py): a LoRA adapter on this base (e.g. the SFT policy) "
            "or a model of its family, toward which rollouts whose answer was wrong are pulled (default: none)"
        },
    )
    teacher_coef: float = field(
        default=0.1, metadata={"help": "weight of the teacher's KL per trained token (with --teacher)"}
    )


def prepare_trajectory_logs(output_dir: str, resume: str | None) -> None:
    """Each step's rollouts are logged once: a run resumed from ``resume`` (a checkpoint) drops the logged
    rollouts of the steps it redoes; a fresh run moves an earlier run's logs into ``previous-N/``."""
    if resume is None:
        kept = keep_previous_logs(output_dir)
        if kept:
            logger.info("fresh run in %s: the earlier run's trajectory logs moved to %s", output_dir, kept)
        return
    step = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"]
    dropped = forget_steps_from(output_dir, step)
    logger.info("resuming at step %d: %d logged rollouts of steps >= %d are redone", step, dropped, step)


def use_demonstration(args: ParallelSearchArguments) -> bool:
    """``--demonstration`` when given; else on from a base model and off when continuing a trained adapter."""
    return args.init_adapter is None if args.demonstration is None else args.demonstration


@contextlib.contextmanager
def rollout_server(model: str, output_dir: str) -> Iterator[VLLMServer]:
    """The vllm-cpu server of ``--backend vllm-cpu``, stopped when the run ends however it ends; a virtualenv
    that cannot be built or a server that does not start is refused with the reason and what to use instead."""
    server = VLLMServer(model, lora_rank=0, reloadable=True, kv_cache_gib=1, log=Path(output_dir) / "vllm-server.log")
    try:
        server.start()
    except VLLMUnavailable as exc:
        raise SystemExit(
            f"--backend vllm-cpu: {exc}\nUse --backend hf (slower rollouts, no server), or --backend openai "
            "--openai_base_url URL with a vLLM server you started."
        ) from exc
    try:
        yield server
    finally:
        server.stop()


def server_died(server: VLLMServer, output_dir: str) -> str:
    """The message a run stops with when its vllm-cpu server dies: the server's last words and how to resume."""
    from transformers.trainer_utils import get_last_checkpoint

    checkpoint = get_last_checkpoint(output_dir)
    resume = (
        f"the last checkpoint is {checkpoint}: rerun the same command with --resume_from_checkpoint True"
        if checkpoint
        else "no checkpoint was saved yet: rerun the same command"
    )
    state = (
        "stopped answering /health" if server.process.poll() is None else f"exited (code {server.process.returncode})"
    )
    return (
        f"the vllm-cpu rollout server {state} during training; {resume}.\n"
        f"Its log ({server.log}) ends:\n{server.log_tail(2000)}"
    )


def parse(argv: list[str] | None = None):
    """``(ParallelSearchArguments, GRPOConfig)`` from flags and ``--config``, over this script's defaults."""
    from trl import GRPOConfig, TrlParser

    parser = TrlParser((ParallelSearchArguments, GRPOConfig))
    parser.set_defaults(**DEFAULTS, **device_defaults())
    args, config = parser.parse_args_and_config(args=argv)[:2]
    return args, config


def main(argv: list[str] | None = None, callbacks: list | None = None) -> Path:
    """Parse flags (and ``--config``), train, save ``OUTPUT_DIR/final``; ``callbacks`` go to the trainer."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    # before parse, which says the CPU's precision once
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, config = parse(argv)
    logger.info("training in %s", "bfloat16 autocast" if config.bf16 else "float32")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a non-interactive shell's `... &`: Ctrl-C cannot stop it
        logger.warning("this process ignores SIGINT (started in the background): stop it with `kill %d`", os.getpid())

    if args.teacher_coef < 0:
        raise SystemExit(f"--teacher_coef {args.teacher_coef}: expected 0 or more (the KL pulls toward the teacher)")
    if args.backend != "trl-vllm":  # our rollouts sample with temperature and top_p only
        ignored = {
            "--top_k": config.top_k not in (0, None, -1),
            "--min_p": config.min_p is not None,
            "--repetition_penalty": config.repetition_penalty not in (None, 1.0),
            "--generation_kwargs": bool(config.generation_kwargs),
        }
        if named := [flag for flag, given in ignored.items() if given]:
            raise SystemExit(
                f"{', '.join(named)}: the {args.backend} rollouts sample with --temperature and --top_p only; "
                "expected these unset, or --backend trl-vllm"
            )
    path = model_path(args.model_name_or_path)
    shared = Path(str(args.data)).resolve().is_relative_to(SHARED_DATA)
    if shared and args.part != "train":  # the benchmarks report on its validation part
        raise SystemExit(f"--data {args.data} is a shared benchmark file: train on its train part, --part train")
    rows = load_questions(args.data, limit=args.limit, part=args.part)
    step_size = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size
    questions = rows_record(str(args.data), rows, config.seed, step_size // config.num_generations)
    restore_corpora(rows)
    weights = RewardWeights(args.lambda_d, choose_alpha(rows, args.alpha), args.lambda_s, args.lambda_f)
    resume = checked_resume(config.output_dir, config.resume_from_checkpoint, path, questions)  # before any log moves
    processes = PartialState()
    if processes.is_main_process:  # once: every process's log is the run's
        prepare_trajectory_logs(config.output_dir, resume)
    processes.wait_for_everyone()
    with contextlib.ExitStack() as stack:  # the rollout server, when this run starts one, stops however it ends
        stack.enter_context(sigterm_unwinds())
        server = None
        if args.backend == "vllm-cpu":
            server = stack.enter_context(rollout_server(path, config.output_dir))
        settings = RolloutSettings(
            agent=agent_config(args, demonstration=use_demonstration(args), corpus=args.corpus),
            backend="openai" if args.backend == "vllm-cpu" else args.backend,
            temperature=config.temperature,
            top_p=config.top_p,
            openai_base_url=server.base_url if server else args.openai_base_url,
            reward_weights=weights,
            dynamic_sampling=args.dynamic_sampling,
            oversample=args.oversample,
            seed=config.seed,
            weight_sync="reload" if server else "lora",
        )
        # an --init_adapter is checked against the base (refused when trained on another); else TRL loads the base
        model = peft_adapter(args.init_adapter, path, trainable=True) if args.init_adapter else path
        peft_config = new_lora(args)
        trainer_class = epoch_seeded(grpo_trainer_class() if args.lm_head == "scored" else GRPOTrainer)
        guidance = {}
        if args.teacher:
            trainer_class = teacher_guided(trainer_class)
            guidance = {"teacher": load_teacher(args.teacher, path), "teacher_coef": args.teacher_coef}
        trainer = trainer_class(
            model=model,
            reward_funcs=reward_functions(weights),
            args=config,
            train_dataset=to_dataset(rows),
            processing_class=AutoTokenizer.from_pretrained(path),
            peft_config=peft_config,
            rollout_func=AgentRollout(settings, rows, config.output_dir),
            callbacks=[*(callbacks or []), record_in_checkpoints(questions), skip_nonfinite_steps()],
            **guidance,
        )
        try:
            trainer.train(resume_from_checkpoint=resume)
        except Exception as exc:
            if server is not None and not server.healthy():
                raise SystemExit(server_died(server, config.output_dir)) from exc
            raise
    final = Path(config.output_dir) / "final"
    trainer.save_model(str(final))
    logger.info("saved the trained %s to %s", "adapter" if peft_config or args.init_adapter else "model", final)
    return final


if __name__ == "__main__":
    main()
