"""GRPO rollouts: the real LangGraph agent run for every prompt with the policy being trained.

``AgentRollout`` is TRL's ``rollout_func``. For each prompt it runs ``ParallelSearchAgent`` (tags
protocol) and returns token-exact sequences: ``completion_ids`` is the policy's own generated tokens
and the observation tokens, in order, exactly as the policy was conditioned on them; ``env_mask`` is 0
on observation tokens; ``logprobs`` are the sampling log-probabilities of generated tokens; and
``trajectory``, the structured trajectory, which TRL hands to the reward functions of ``ps_agent.rewards``
beside the dataset columns. Each rollout is a line of the trajectory log, and the rollout metrics are
logged here, once per batch, through TRL's ``log_metric``.

Backends: ``hf`` (in-process generation with the trainer's model, batched across all active rollouts
turn by turn), ``openai`` (an OpenAI-compatible server that hot-loads the LoRA adapter after each
optimizer step: vLLM), and ``trl-vllm`` (TRL's own vLLM integration, ``use_vllm=True``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ps_agent.agent import ParallelSearchAgent
from ps_agent.llms import OpenAICompletionsPolicy, TransformersPolicy, chat_prompt_ids, segment_ids
from ps_agent.llms.trl_vllm import TRLVLLMPolicy
from ps_agent.metrics import mean
from ps_agent.rewards import RewardWeights, decomposed, format_valid, question_class, reward_components
from ps_agent.trajectories import TrajectoryLog, summarise, timeline_of

logger = logging.getLogger(__name__)


@dataclass
class RolloutSettings:
    """How rollouts run. ``retriever`` is a retriever object or spec (None: the embedded corpus)."""

    backend: str = "hf"
    mode: str = "parallel"
    max_turns: int = 2
    topk: int = 2
    max_new_tokens: int = 96
    demonstration: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    retriever: Any = None
    openai_base_url: str | None = None
    reward_weights: RewardWeights = field(default_factory=RewardWeights)

    def __post_init__(self) -> None:
        if self.backend not in ("hf", "openai", "trl-vllm"):
            raise ValueError(f"backend must be 'hf', 'openai' or 'trl-vllm', got {self.backend!r}")
        if self.backend == "openai" and not self.openai_base_url:
            raise ValueError("the openai backend needs openai_base_url (e.g. http://127.0.0.1:8000/v1)")


def token_sequences(
    trajectory: dict[str, Any], tokenizer: Any, max_completion_length: int | None = None
) -> dict[str, Any]:
    """Prompt ids, completion ids, env mask and logprobs of one rollout, exactly as the policy saw them.

    An episode that ended with an answer ends with the tokenizer's end-of-turn token (environment side:
    mask 0), so TRL sees a finished completion, not a clipped one. An episode longer than
    ``max_completion_length`` is cut there and marked ``truncated`` (no end-of-turn token).
    """
    completion_ids: list[int] = []
    env_mask: list[int] = []
    logprobs: list[float] = []
    model_turns = iter(trajectory["llm_calls"])
    for segment in trajectory["transcript"]:
        ids = segment_ids(tokenizer, segment)
        completion_ids += ids
        if segment["role"] == "model":
            call = next(model_turns)
            env_mask += [1] * len(ids)
            logprobs += call["logprobs"]
        else:
            env_mask += [0] * len(ids)
            logprobs += [0.0] * len(ids)
    if trajectory.get("answer") is not None and tokenizer.eos_token_id is not None:
        completion_ids.append(tokenizer.eos_token_id)
        env_mask.append(0)
        logprobs.append(0.0)
    truncated = max_completion_length is not None and len(completion_ids) > max_completion_length
    if truncated:
        completion_ids, env_mask, logprobs = (x[:max_completion_length] for x in (completion_ids, env_mask, logprobs))
    return {
        "prompt_ids": chat_prompt_ids(tokenizer, trajectory["prompt_messages"]),
        "completion_ids": completion_ids,
        "env_mask": env_mask,
        "logprobs": logprobs,
        "truncated": truncated,
    }


def rollout_record(
    out: dict[str, Any], row: dict[str, Any], step: int, truncated: bool, weights: RewardWeights
) -> dict[str, Any]:
    """The trajectory log line of one rollout, with the reward components the reward functions give it."""
    trajectory, stats = out["trajectory"], out["stats"]
    return {
        "step": step,
        "id": row.get("id"),
        "question": trajectory["question"],
        "question_type": row["question_type"],
        "question_class": question_class(row["question_type"]),
        "golden_answers": row["golden_answers"],
        "answer": out["answer"],
        "rewards": reward_components(trajectory, row["golden_answers"], row["question_type"], weights),
        "format_valid": format_valid(trajectory),
        "decomposed": decomposed(trajectory),
        "truncated": truncated,
        **timeline_of(trajectory),  # turns and search rounds, as an eval's results keep them
        "stats": stats,
    }


def log_rollout_metrics(records: list[dict[str, Any]], log_metric: Callable[[str, float], None]) -> None:
    """Signals that show GRPO collapse coming and whether decomposition is learnt, from a batch's log lines
    (TRL logs the rest: rewards, reward std per group, entropy, completion lengths)."""
    summary = summarise(records)
    metrics = {
        "rollout/forced_answer_frac": summary["forced_answer"],
        "rollout/format_valid_frac": summary["format_valid"],
        "rollout/search_rounds": summary["search_rounds"],
        "rollout/failed_searches": float(sum(r["stats"]["failed_searches"] for r in records)),
        "rollout/truncated_frac": mean([float(r["truncated"]) for r in records]),
    } | {f"rollout/decomposed_frac/{cls}": v for cls, v in summary["decomposed_by_class"].items()}
    for name, value in metrics.items():
        log_metric(name, value)


class AgentRollout:
    """TRL ``rollout_func``: one agent rollout per prompt, its trajectory for the reward functions, a log line
    and the rollout metrics."""

    def __init__(self, settings: RolloutSettings, rows: Sequence[dict[str, Any]], output_dir: str | Path) -> None:
        self.settings = settings
        self.rows = {row["prompt"]: row for row in rows}  # the log line's question: id, golden answers, class
        self.output_dir = Path(output_dir)
        self._adapter_step: int | None = None
        self._adapter_name: str | None = None
        self.generation_batches: list[int] = []  # batch sizes of the last rollout's generations (hf, trl-vllm)

    # -- policies --------------------------------------------------------------------------------

    def _policy(self, trainer: Any, rollouts: int) -> Any:
        s = self.settings
        if s.backend == "hf":
            model = trainer.accelerator.unwrap_model(trainer.model)
            policy = TransformersPolicy(model, trainer.processing_class, temperature=s.temperature, top_p=s.top_p)
            policy.expected = rollouts  # gather every active rollout's turn into one batch
            return policy
        if s.backend == "openai":
            return OpenAICompletionsPolicy(
                s.openai_base_url,
                model=self._sync_adapter(trainer),
                temperature=s.temperature,
                top_p=s.top_p,
                tokenizer=trainer.processing_class,
            )
        return TRLVLLMPolicy(trainer, rollouts)

    def _sync_adapter(self, trainer: Any) -> str:
        """After each optimizer step: save the LoRA adapter and load it into the server under a new name."""
        step = trainer.state.global_step
        if step != self._adapter_step:
            name = f"policy-step-{step}"
            path = (self.output_dir / "adapters" / name).resolve()
            if trainer.accelerator.is_main_process:
                trainer.accelerator.unwrap_model(trainer.model).save_pretrained(path)
                root = self.settings.openai_base_url.rstrip("/").removesuffix("/v1")
                response = httpx.post(
                    f"{root}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=120
                )
                if response.status_code != 200:
                    raise RuntimeError(f"loading adapter {name} into {root} failed: {response.text}")
                logger.info("loaded adapter %s into %s", name, root)
            trainer.accelerator.wait_for_everyone()
            self._adapter_step, self._adapter_name = step, name
        return self._adapter_name

    # -- rollouts --------------------------------------------------------------------------------

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        missing = [p for p in prompts if p not in self.rows]
        if missing:
            raise KeyError(f"rollout prompt not in the training rows: {missing[0]!r}")
        policy = self._policy(trainer, len(prompts))
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            outs = asyncio.run(self._run_all(prompts, policy))
        finally:
            model.train(was_training)
        self.generation_batches = getattr(policy, "batch_sizes", [])

        max_length = getattr(getattr(trainer, "args", None), "max_completion_length", None)
        sequences = [token_sequences(out["trajectory"], trainer.processing_class, max_length) for out in outs]
        step, weights = trainer.state.global_step, self.settings.reward_weights
        records = [
            rollout_record(out, self.rows[prompt], step, seq["truncated"], weights)
            for prompt, out, seq in zip(prompts, outs, sequences, strict=True)
        ]
        log = TrajectoryLog(self.output_dir / f"trajectories-{trainer.accelerator.process_index}.jsonl")
        for record in records:
            log.append(record)
        # TRL's log_metric hook (the one it hands reward functions): averaged over the logging step and across
        # processes, beside TRL's own metrics
        log_rollout_metrics(records, trainer._log_metric)
        return {
            key: [seq[key] for seq in sequences] for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs")
        } | {"trajectory": [out["trajectory"] for out in outs]}

    async def _run_all(self, prompts: list[str], policy: Any) -> list[dict[str, Any]]:
        s = self.settings
        agent = ParallelSearchAgent(
            llm=policy,
            retriever=s.retriever,
            mode=s.mode,
            max_turns=s.max_turns,
            topk=s.topk,
            max_new_tokens=s.max_new_tokens,
            demonstration=s.demonstration,
        )
        if isinstance(policy, TRLVLLMPolicy):
            return await policy.run([agent.ainvoke({"question": p}) for p in prompts])

        async def one(prompt: str) -> dict[str, Any]:
            try:
                return await agent.ainvoke({"question": prompt})
            finally:
                if isinstance(policy, TransformersPolicy):
                    policy.expected -= 1  # a finished rollout leaves the batch

        return await asyncio.gather(*(one(p) for p in prompts))
