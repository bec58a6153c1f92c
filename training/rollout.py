"""GRPO rollouts: the real LangGraph agent run for every prompt with the policy being trained.

``AgentRollout`` is TRL's ``rollout_func``. For each prompt it runs ``ParallelSearchAgent`` (tags
protocol) and returns token-exact sequences: ``completion_ids`` is the policy's own generated tokens
and the observation tokens, in order, exactly as the policy was conditioned on them; ``env_mask`` is 0
on observation tokens; ``logprobs`` are the sampling log-probabilities of generated tokens; and
``trajectory``, the structured trajectory, which TRL hands to the reward functions of ``ps_agent.rewards``
beside the dataset columns. Each rollout is a line of the trajectory log, and the rollout metrics are
logged here, once per batch, through TRL's ``log_metric``.

Backends: ``hf`` (in-process generation with the trainer's model, batched across all active rollouts turn by turn),
``openai`` (an OpenAI-compatible server that hot-loads the LoRA adapter after each optimizer step, or reloads the
merged weights: vLLM; ``training.weight_sync``), and ``trl-vllm`` (TRL's own vLLM integration, ``use_vllm=True``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

from ps_agent.agent import ParallelSearchAgent
from ps_agent.configuration import AgentConfig
from ps_agent.episodes import episode_record, summarise_rollouts
from ps_agent.graph import AgentError
from ps_agent.llms import ContextFull, OpenAICompletionsPolicy, TransformersPolicy
from ps_agent.llms.tokens import token_sequences
from ps_agent.metrics import mean, think_lengths
from ps_agent.questions import QUESTION_CLASSES
from ps_agent.rewards import RewardWeights, reward_components
from ps_agent.trajectories import TrajectoryLog
from training.signals import ctrl_c_interrupts
from training.trl_vllm import TRLVLLMPolicy
from training.weight_sync import WeightSync

logger = logging.getLogger(__name__)

POLICY_FAULTS = (ContextFull, TimeoutError)  # a run that fails of these is the episode's failing, not the step's


@dataclass
class RolloutSettings:
    """How rollouts run. ``agent`` is the agent's settings, as it runs everywhere else; its ``corpus`` is a
    retriever object or spec (None: the embedded corpus), and a row with a ``corpus`` (a corpus jsonl path) is
    searched in that corpus instead. Its ``llm`` is unused: the policy being trained plays it.

    ``dynamic_sampling``: rounds of DAPO's dynamic sampling per batch (0: off). A group whose rewards are all
    equal has zero advantage and teaches nothing; each round draws ``oversample`` × as many fresh training
    questions as there are such groups, rolls each out ``num_generations`` times, and puts the groups whose
    rewards differ in their place.

    ``weight_sync`` (the ``openai`` backend): how the server gets each optimizer step's policy: ``lora`` loads the
    adapter (``--enable-lora``), ``reload`` swaps in the merged weights (a ``VLLMServer(reloadable=True)``)."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    openai_base_url: str | None = None
    reward_weights: RewardWeights = field(default_factory=RewardWeights)
    dynamic_sampling: int = 0
    oversample: int = 2
    seed: int = 0
    weight_sync: str = "lora"

    def __post_init__(self) -> None:
        if self.backend not in ("hf", "openai", "trl-vllm"):
            raise ValueError(f"backend must be 'hf', 'openai' or 'trl-vllm', got {self.backend!r}")
        if self.backend == "openai" and not self.openai_base_url:
            raise ValueError("the openai backend needs openai_base_url (e.g. http://127.0.0.1:8000/v1)")
        if self.weight_sync not in ("lora", "reload"):
            raise ValueError(f"weight_sync must be 'lora' or 'reload', got {self.weight_sync!r}")
        if self.dynamic_sampling < 0 or self.oversample < 1:
            raise ValueError(
                f"dynamic_sampling must be >= 0 rounds and oversample >= 1, got {self.dynamic_sampling} and "
                f"{self.oversample}"
            )
        if self.dynamic_sampling and self.backend == "trl-vllm":
            raise ValueError(
                "dynamic sampling draws a different number of rollouts on each rank, which TRL's vLLM generation "
                "(every rank in step) cannot serve: use --backend hf, openai or vllm-cpu, or --dynamic_sampling 0"
            )


def failed_episode(exc: BaseException) -> dict[str, Any]:
    """A rollout whose run failed by the policy's own doing (its context filled the model's window, or it ran past
    ``run_timeout_s``): unanswered, as far as it got, with the reason under ``failed``; it earns no outcome reward
    and is not trained on. Any other failure (a rollout server down) is raised: the step cannot go on."""
    if not (isinstance(exc, AgentError) and isinstance(exc.__cause__, POLICY_FAULTS)):
        raise exc
    logger.warning("a rollout failed, kept as an unanswered episode and not trained on: %s", exc)
    return {"answer": None, "trajectory": exc.trajectory, "stats": exc.stats, "failed": str(exc)}


def rollout_record(
    out: dict[str, Any], row: dict[str, Any], step: int, truncated: bool, weights: RewardWeights
) -> dict[str, Any]:
    """The trajectory log line of one rollout: the episode's record, as an eval keeps it, with the reward
    components the reward functions give it, under its step (a failed run: its reason under ``error``)."""
    return {"step": step} | episode_record(row, out, weights) | {"truncated": truncated, "error": out.get("failed")}


def log_rollout_metrics(records: list[dict[str, Any]], log_metric: Callable[[str, float], None]) -> None:
    """Signals that show GRPO collapse coming and whether decomposition is learnt, from a batch's log lines
    (TRL logs the rest: rewards, reward std per group, entropy, completion lengths).

    Each share or mean is logged once for each rollout (or think block) it is taken over: TRL averages every
    value logged, on every process, with the same weight, so one share per process read a process's one
    parallelisable rollout as much as another's five (the shares 1/1 and 1/5 logged 0.6, not 2/6)."""
    summary = summarise_rollouts(records)
    rollouts, classes = len(records), Counter(r["question_class"] for r in records)
    metrics = {
        "rollout/forced_answer_frac": (summary["forced_answer"], rollouts),
        "rollout/format_valid_frac": (summary["format_valid"], rollouts),
        "rollout/search_rounds": (summary["search_rounds"], rollouts),
        "rollout/failed_searches": (float(sum(r["failed_searches"] for r in records)), 1),  # a sum: per process
        "rollout/truncated_frac": (mean([float(r["truncated"]) for r in records]), rollouts),
        "rollout/over_search_frac": (summary["over_search"], rollouts),
        "rollout/under_search_frac": (summary["under_search"], rollouts),
        "rollout/think_words": (summary["think_words"], len(think_lengths(records))),
    } | {f"rollout/decomposed_frac/{c}": (v, classes[c]) for c, v in summary["decomposed_by_class"].items()}
    # every class, 0 where a batch has none: a class logged only where present read 0.5 for a class a third of
    # the rollouts held (6 processes, docs/scale.md)
    metrics |= {f"rollout/class_frac/{c}": (summary["class_mix"].get(c, 0.0), rollouts) for c in QUESTION_CLASSES}
    for name, (value, weight) in metrics.items():
        if value is not None:  # think_words under the tools protocol, whose turns have no think blocks
            for _ in range(weight):
                log_metric(name, value)


def zero_std_groups(totals: Sequence[float], group_size: int) -> list[int]:
    """Indexes of the groups (consecutive runs of ``group_size``) whose rewards are all equal."""
    groups = [totals[i : i + group_size] for i in range(0, len(totals), group_size)]
    return [g for g, values in enumerate(groups) if max(values) - min(values) < 1e-9]


def rollout_policy(settings: RolloutSettings, trainer: Any, rollouts: int, sync: WeightSync) -> Any:
    """The policy being trained, as the backend serves it for a batch of ``rollouts``."""
    if settings.backend == "hf":
        model = trainer.accelerator.unwrap_model(trainer.model)
        bf16 = getattr(getattr(trainer, "args", None), "bf16", False)  # generate in the precision it trains in
        return TransformersPolicy(
            model,
            trainer.processing_class,
            temperature=settings.temperature,
            top_p=settings.top_p,
            autocast=torch.bfloat16 if bf16 else None,
        )
    if settings.backend == "openai":
        return OpenAICompletionsPolicy(
            settings.openai_base_url,
            model=sync(trainer),
            temperature=settings.temperature,
            top_p=settings.top_p,
            tokenizer=trainer.processing_class,
        )
    return TRLVLLMPolicy(trainer, rollouts)


def fresh_questions(questions: Iterable[str], taken: Iterable[str], seed: str, rank: int, ranks: int) -> list[str]:
    """One rank's pool for dynamic sampling in one step: the questions that no rank's batch holds (``taken``), in
    an order ``seed`` draws for every rank alike, dealt out so that each rank draws its own. Drawn per rank from one
    pool, a question could be two groups of one step: trained twice, and merged in the logged group statistics."""
    pool = sorted(set(questions) - set(taken))
    random.Random(seed).shuffle(pool)
    return pool[rank::ranks]


def resample_zero_std_groups(
    prompts: list[str],
    outs: list[dict[str, Any]],
    size: int,
    fresh_pool: list[str],
    rollout: Callable[[list[str]], list[dict[str, Any]]],
    total: Callable[[str, dict[str, Any]], float],
    settings: RolloutSettings,
    log_metric: Callable[[str, float], None],
) -> tuple[list[str], list[dict[str, Any]]]:
    """DAPO's dynamic sampling: put groups (``size`` rollouts of a prompt) of fresh questions, drawn in order from
    ``fresh_pool``, whose rewards (``total``) differ in the place of groups whose rewards are all equal, for up to
    ``settings.dynamic_sampling`` rounds of ``rollout``."""
    starts = range(0, len(prompts), size)
    if len(prompts) % size or any(len(set(prompts[i : i + size])) != 1 for i in starts):
        logger.warning("dynamic sampling skipped: this process's prompts are not whole groups of %d", size)
        return prompts, outs
    zero = zero_std_groups([total(p, o) for p, o in zip(prompts, outs, strict=True)], size)
    log_metric("rollout/frac_reward_zero_std_before", len(zero) / (len(prompts) // size))
    pool, drawn, rounds = list(fresh_pool), 0, 0
    while zero and pool and rounds < settings.dynamic_sampling:
        rounds += 1
        fresh, pool = pool[: settings.oversample * len(zero)], pool[settings.oversample * len(zero) :]
        drawn += len(fresh)
        tried = [p for p in fresh for _ in range(size)]
        tried_outs = rollout(tried)
        dead = set(zero_std_groups([total(p, o) for p, o in zip(tried, tried_outs, strict=True)], size))
        kept = [g for g in range(len(fresh)) if g not in dead]
        for g in kept[: len(zero)]:
            slot = zero.pop(0) * size
            prompts[slot : slot + size] = tried[g * size : (g + 1) * size]
            outs[slot : slot + size] = tried_outs[g * size : (g + 1) * size]
    log_metric("rollout/resample_rounds", float(rounds))
    log_metric("rollout/resampled_questions", float(drawn))
    return prompts, outs


class AgentRollout:
    """TRL ``rollout_func``: one agent rollout per prompt, its trajectory for the reward functions, a log line
    and the rollout metrics; with ``settings.dynamic_sampling``, zero-variance groups are replaced. It holds what
    lasts across batches: the rows by question, the weight sync, and the last batch's generation sizes."""

    def __init__(self, settings: RolloutSettings, rows: Sequence[dict[str, Any]], output_dir: str | Path) -> None:
        self.settings = settings
        self.rows: dict[str, dict[str, Any]] = {}  # TRL's prompts are the rows' questions
        for row in rows:
            earlier = self.rows.setdefault(row["question"], row)
            if any(earlier.get(k) != row.get(k) for k in ("golden_answers", "question_type", "corpus")):
                raise ValueError(
                    f"rows {earlier.get('id')} and {row.get('id')} both ask {row['question']!r:.100} with other "
                    "answers, type or corpus: a rollout knows its question by its text alone, so one would be "
                    "scored by the other's; expected each question text once"
                )
        self.output_dir = Path(output_dir)
        self.sync = WeightSync(settings.openai_base_url, settings.weight_sync, self.output_dir)
        self.policy: Callable[[Any, int], Any] = lambda trainer, n: rollout_policy(settings, trainer, n, self.sync)
        self.generation_batches: list[int] = []  # batch sizes of the last rollout's generations (hf, trl-vllm)

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        missing = [p for p in prompts if p not in self.rows]
        if missing:
            raise KeyError(f"rollout prompt not in the training rows: {missing[0]!r}")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        started = time.monotonic()
        try:
            outs = self.rollout(prompts, trainer)
            if self.settings.dynamic_sampling:
                accelerator = trainer.accelerator
                taken = gather_object(sorted(set(prompts))) if accelerator.num_processes > 1 else prompts
                seed = f"{self.settings.seed}-{trainer.state.global_step}"
                pool = fresh_questions(self.rows, taken, seed, accelerator.process_index, accelerator.num_processes)
                prompts, outs = resample_zero_std_groups(
                    list(prompts), outs, trainer.num_generations, pool, lambda tried: self.rollout(tried, trainer),
                    self.total, self.settings, trainer._log_metric,
                )  # fmt: skip
        finally:
            model.train(was_training)
        seconds = time.monotonic() - started

        args = getattr(trainer, "args", None)
        max_length = getattr(args, "max_completion_length", None)
        sequences = [token_sequences(out["trajectory"], trainer.processing_class, max_length) for out in outs]
        for out, seq in zip(outs, sequences, strict=True):
            seq["truncated"] = seq["truncated"] or "failed" in out  # a failed run was cut short too
            if seq["truncated"] and getattr(args, "mask_truncated_completions", True):
                seq["env_mask"] = [0] * len(seq["env_mask"])  # TRL's own check reads only the last token
        step, weights = trainer.state.global_step, self.settings.reward_weights
        rows = [self.rows[prompt] for prompt in prompts]
        records = [
            rollout_record(out, row, step, seq["truncated"], weights)
            for row, out, seq in zip(rows, outs, sequences, strict=True)
        ]
        log = TrajectoryLog(self.output_dir / f"trajectories-{trainer.accelerator.process_index}.jsonl")
        for record in records:
            log.append(record)
        # TRL's log_metric hook (the one it hands reward functions): averaged over the logging step and across
        # processes, beside TRL's own metrics
        log_rollout_metrics(records, trainer._log_metric)
        generated = sum(turn["completion_tokens"] or 0 for record in records for turn in record["timeline"]["turns"])
        trainer._log_metric("rollout/seconds", seconds)  # every rollout of the batch, resampled ones included
        trainer._log_metric("rollout/kept_tokens_per_s", generated / seconds)  # sampled tokens trained on
        # the question columns go back too: dynamic sampling may have put other questions in a group's place,
        # and TRL hands these fields to the reward functions instead of the dataset's
        return {
            key: [seq[key] for seq in sequences] for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs")
        } | {
            "trajectory": [out["trajectory"] for out in outs],
            "golden_answers": [row["golden_answers"] for row in rows],
            "question_type": [row["question_type"] for row in rows],
        }

    def rollout(self, prompts: list[str], trainer: Any) -> list[dict[str, Any]]:
        """One agent run per prompt, all at once, with the policy of this step."""
        policy = self.policy(trainer, len(prompts))
        with ctrl_c_interrupts():
            outs = asyncio.run(run_agents([self.rows[p] for p in prompts], policy, self.settings, True))
        self.generation_batches = getattr(policy, "batch_sizes", [])
        return [failed_episode(out) if isinstance(out, BaseException) else out for out in outs]

    def total(self, prompt: str, out: dict[str, Any]) -> float:
        """The reward the reward functions will give this rollout (their sum)."""
        row = self.rows[prompt]
        weights = self.settings.reward_weights
        return reward_components(out["trajectory"], row["golden_answers"], row["question_type"], weights)["total"]


async def run_agents(
    rows: Sequence[dict[str, Any]], policy: Any, settings: RolloutSettings, return_exceptions: bool = False
) -> list[Any]:
    """The agent's run on each training row with ``policy``, all concurrently; a row with a ``corpus`` is
    searched there, the others in ``settings.agent.corpus``. ``return_exceptions``: a failed run's exception
    (an ``AgentError`` with its partial trajectory) takes its place, and the others go on."""
    agents: dict[Any, ParallelSearchAgent] = {}
    for corpus in {row.get("corpus") for row in rows}:
        searched = settings.agent.corpus if corpus is None else corpus
        agents[corpus] = ParallelSearchAgent.from_config(replace(settings.agent, llm=policy, corpus=searched))
    runs = [agents[row.get("corpus")].ainvoke({"question": row["question"]}) for row in rows]
    if isinstance(policy, TRLVLLMPolicy):
        return await policy.run(runs)
    if isinstance(policy, TransformersPolicy):
        policy.expected = len(runs)  # every active rollout's turn in one batch (a resampled group's too)

    async def one(run: Any) -> dict[str, Any]:
        try:
            return await run
        finally:
            if isinstance(policy, TransformersPolicy):
                policy.expected -= 1  # a finished rollout leaves the batch

    return await asyncio.gather(*(one(r) for r in runs), return_exceptions=return_exceptions)
