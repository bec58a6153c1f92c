"""GRPO rollouts: the real LangGraph agent run for every prompt with the policy being trained.

``AgentRollout`` is TRL's ``rollout_func``. For each prompt it runs ``ParallelSearchAgent`` (tags
protocol) and returns token-exact sequences: ``completion_ids`` is the policy's own generated tokens
and the observation tokens, in order, exactly as the policy was conditioned on them; ``env_mask`` is 0
on observation tokens; ``logprobs`` are the sampling log-probabilities of generated tokens. Reward
components are computed here (``ps_agent.rewards``), logged with the trajectory, and handed to the
reward functions as ``reward_components``.

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
from ps_agent.llms import (
    Completion,
    OpenAICompletionsPolicy,
    TransformersPolicy,
    chat_prompt_ids,
    context_ids,
    generated_length,
    segment_ids,
)
from ps_agent.protocol import ChatPrompt
from ps_agent.rewards import (
    COMPONENTS,
    QUESTION_CLASSES,
    RewardWeights,
    decomposed,
    format_valid,
    question_class,
    reward_components,
)
from ps_agent.state import Segment
from ps_agent.trajectories import TrajectoryLog, mean

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


def rollout_record(out: dict[str, Any], row: dict[str, Any], rewards: dict[str, float], step: int) -> dict[str, Any]:
    """The trajectory log line of one rollout."""
    trajectory, stats = out["trajectory"], out["stats"]
    return {
        "step": step,
        "id": row.get("id"),
        "question": trajectory["question"],
        "question_type": row["question_type"],
        "question_class": question_class(row["question_type"]),
        "golden_answers": row["golden_answers"],
        "answer": out["answer"],
        "rewards": rewards,
        "format_valid": format_valid(trajectory),
        "decomposed": decomposed(trajectory),
        "turns": [
            {k: call[k] for k in ("turn", "action", "completion", "completion_tokens", "finish_reason")}
            for call in trajectory["llm_calls"]
        ],
        "search_rounds": [
            {
                "sub_queries": r["sub_queries"],
                "results": [
                    {"sub_query": x["sub_query"], "passages": x["passages"], "error": x["error"]} for x in r["results"]
                ],
            }
            for r in trajectory["search_rounds"]
        ],
        "stats": stats,
    }


class TRLVLLMPolicy:
    """Generation through TRL's own vLLM integration (``use_vllm=True``, colocate or server mode).

    TRL syncs the trainer's weights into vLLM before each rollout; this policy asks it for one
    completion per context and cuts it after the first stop string, as vLLM there knows no stop strings.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.tokenizer = trainer.processing_class

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        context = context_ids(self.tokenizer, prompt, transcript)
        _, completions, logprobs, _ = await asyncio.to_thread(
            self.trainer.vllm_generation.generate, prompts=[context], images=None, num_generations=1
        )
        ids, lps = list(completions[0]), [lp[0] if isinstance(lp, list) else lp for lp in logprobs[0]]
        n = min(generated_length(self.tokenizer, ids, stop), max_tokens)
        ids, lps = ids[:n], lps[:n]
        return Completion(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            prompt_text=self.tokenizer.decode(context),
            prompt_tokens=len(context),
            completion_tokens=len(ids),
            token_ids=ids,
            logprobs=lps,
            finish_reason="stop",
        )


class AgentRollout:
    """TRL ``rollout_func``: one agent rollout per prompt, with rewards and a trajectory log."""

    def __init__(self, settings: RolloutSettings, rows: Sequence[dict[str, Any]], output_dir: str | Path) -> None:
        self.settings = settings
        self.rows = {row["prompt"]: row for row in rows}
        self.output_dir = Path(output_dir)
        self._adapter_step: int | None = None
        self._adapter_name: str | None = None
        self.generation_batches: list[int] = []  # batch sizes of the last rollout's generations (hf backend)

    # -- policies --------------------------------------------------------------------------------

    def _policy(self, trainer: Any) -> Any:
        s = self.settings
        if s.backend == "hf":
            model = trainer.accelerator.unwrap_model(trainer.model)
            return TransformersPolicy(model, trainer.processing_class, temperature=s.temperature, top_p=s.top_p)
        if s.backend == "openai":
            return OpenAICompletionsPolicy(
                s.openai_base_url,
                model=self._sync_adapter(trainer),
                temperature=s.temperature,
                top_p=s.top_p,
                tokenizer=trainer.processing_class,
            )
        return TRLVLLMPolicy(trainer)

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

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        missing = [p for p in prompts if p not in self.rows]
        if missing:
            raise KeyError(f"rollout prompt not in the training rows: {missing[0]!r}")
        policy = self._policy(trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            outs = asyncio.run(self._run_all(prompts, policy))
        finally:
            model.train(was_training)
        self.generation_batches = getattr(policy, "batch_sizes", [])
        return self._assemble(prompts, outs, trainer)

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
        if isinstance(policy, TransformersPolicy):
            policy.expected = len(prompts)  # gather every active rollout's turn into one batch

        async def one(prompt: str) -> dict[str, Any]:
            try:
                return await agent.ainvoke({"question": prompt})
            finally:
                if isinstance(policy, TransformersPolicy):
                    policy.expected -= 1  # a finished rollout leaves the batch

        return await asyncio.gather(*(one(p) for p in prompts))

    def _assemble(self, prompts: list[str], outs: list[dict[str, Any]], trainer: Any) -> dict[str, list]:
        tokenizer = trainer.processing_class
        log = TrajectoryLog(self.output_dir / f"trajectories-{trainer.accelerator.process_index}.jsonl")
        max_length = getattr(getattr(trainer, "args", None), "max_completion_length", None)
        batch: dict[str, list] = {
            k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "logprobs", "reward_components", "rollout")
        }
        for prompt, out in zip(prompts, outs, strict=True):
            row = self.rows[prompt]
            rewards = reward_components(
                out["trajectory"], row["golden_answers"], row["question_type"], self.settings.reward_weights
            )
            sequences = token_sequences(out["trajectory"], tokenizer, max_length)
            record = rollout_record(out, row, rewards, trainer.state.global_step) | {
                "truncated": sequences["truncated"]
            }
            log.append(record)
            for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs"):
                batch[key].append(sequences[key])
            batch["reward_components"].append(rewards)
            batch["rollout"].append(
                {
                    "question_class": record["question_class"],
                    "decomposed": record["decomposed"],
                    "format_valid": record["format_valid"],
                    "search_rounds": out["stats"]["search_rounds"],
                    "forced_answer": out["stats"]["forced_answer"],
                    "failed_searches": out["stats"]["failed_searches"],
                    "truncated": sequences["truncated"],
                }
            )
        return batch


def log_rollout_metrics(rollouts: list[dict[str, Any]], log_metric: Callable[[str, float], None]) -> None:
    """Signals that show GRPO collapse coming and whether decomposition is learnt (TRL logs the rest:
    reward std per group, entropy, completion lengths)."""
    metrics = {
        "rollout/forced_answer_frac": mean([float(r["forced_answer"]) for r in rollouts]),
        "rollout/format_valid_frac": mean([float(r["format_valid"]) for r in rollouts]),
        "rollout/search_rounds": mean([float(r["search_rounds"]) for r in rollouts]),
        "rollout/failed_searches": float(sum(r["failed_searches"] for r in rollouts)),
        "rollout/truncated_frac": mean([float(r.get("truncated", False)) for r in rollouts]),
    }
    for cls in QUESTION_CLASSES:
        of_class = [float(r["decomposed"]) for r in rollouts if r["question_class"] == cls]
        metrics[f"rollout/decomposed_frac/{cls}"] = mean(of_class)
    for name, value in metrics.items():
        if value is not None:
            log_metric(name, value)


def reward_functions() -> list[Callable[..., list[float]]]:
    """One TRL reward function per component (TRL sums them and logs each as ``rewards/<name>``);
    the first also logs the rollout signals."""

    def make(name: str) -> Callable[..., list[float]]:
        def reward(completions, reward_components, rollout=None, log_metric=None, **_: Any) -> list[float]:
            if name == COMPONENTS[0] and rollout is not None and log_metric is not None:
                log_rollout_metrics(rollout, log_metric)
            return [float(r[name]) for r in reward_components]

        reward.__name__ = f"{name}_reward"
        return reward

    return [make(name) for name in COMPONENTS]
