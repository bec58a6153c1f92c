"""TRLVLLMPolicy: generation through TRL's own vLLM integration, for GRPO rollouts (``use_vllm=True``).

TRL's ``vllm_generation.generate`` is collective: in server mode every rank gathers its prompts to the main
process, which asks the server, then broadcasts the completions (in colocate mode with tensor parallelism the
ranks of a group gather theirs), and each rank takes the slice at ``rank × its prompt count``. So every rank
must make the same calls with the same number of prompts, whatever its rollouts do. The turns of a rank's
concurrent rollouts are generated as one batch, in rounds that every rank joins with the widest rank's
number of contexts (padded with a one-token context); a rank whose rollouts are done keeps joining, with
none of its own, until no rank has any. Tested on two CPU ranks with TRL's server-mode ``generate`` and a
client double (``tests/test_training.py``); not yet run against a real vLLM on GPUs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from accelerate.utils import gather_object

from ps_agent.batching import MicroBatcher
from ps_agent.llms.base import Completion
from ps_agent.llms.tokens import context_ids, generated_length
from ps_agent.protocol import ChatPrompt
from ps_agent.state import Segment

T = TypeVar("T")
Generated = tuple[list[int], list[float]]


class TRLVLLMPolicy:
    """A GRPO trainer's vLLM (``trainer.vllm_generation``) as a policy for ``rollouts`` concurrent rollouts.

    TRL syncs the trainer's weights into vLLM before each rollout; vLLM there knows no stop strings and
    samples up to ``max_completion_length`` tokens, so each completion is cut after its first stop string.
    Run the rollouts through ``run``, which keeps this rank in step with the others.
    """

    def __init__(self, trainer: Any, rollouts: int, batch_window_s: float = 2.0) -> None:
        self.generation = trainer.vllm_generation
        self.tokenizer = trainer.processing_class
        self.batch_sizes: list[int] = []  # this rank's contexts in each round, for inspection
        self._filler = [self.tokenizer.eos_token_id]
        self._batcher: MicroBatcher[list[int], Generated] = MicroBatcher(
            self._round, size=rollouts, max_wait_s=batch_window_s
        )

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        """The next turn, generated in the round of this rank's concurrent turns."""
        context = context_ids(self.tokenizer, prompt, transcript)
        ((ids, logprobs),) = await self._batcher.submit([context])
        n = min(generated_length(self.tokenizer, ids, stop), max_tokens)
        return Completion(
            text=self.tokenizer.decode(ids[:n], skip_special_tokens=True),
            prompt_text=self.tokenizer.decode(context),
            prompt_tokens=len(context),
            completion_tokens=n,
            token_ids=ids[:n],
            logprobs=logprobs[:n],
            finish_reason="stop",
        )

    async def run(self, rollouts: Sequence[Awaitable[T]]) -> list[T]:
        """Run this rank's rollouts (each leaves the rounds when it ends), then join the other ranks' rounds
        until every rank is done; a rollout's error is raised after that, so no rank is left waiting."""

        async def one(rollout: Awaitable[T]) -> T:
            try:
                return await rollout
            finally:
                self._batcher.size -= 1

        results = await asyncio.gather(*(one(r) for r in rollouts), return_exceptions=True)
        while (await asyncio.to_thread(self.generate, []))[0]:
            pass
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)

    async def _round(self, contexts: list[list[int]]) -> list[Generated]:
        return (await asyncio.to_thread(self.generate, contexts))[1]

    def generate(self, contexts: list[list[int]]) -> tuple[int, list[Generated]]:
        """One round on every rank: the widest rank's number of contexts, and this rank's completions (token
        ids and their sampling log-probabilities). No rank generates in a round of width 0."""
        width = max(gather_object([len(contexts)]))
        if width == 0:
            return 0, []
        padded = contexts + [self._filler] * (width - len(contexts))
        _, completions, logprobs, _ = self.generation.generate(prompts=padded, images=None, num_generations=1)
        self.batch_sizes.append(len(contexts))
        return width, [
            (list(ids), [lp[0] if isinstance(lp, list) else lp for lp in lps])
            for ids, lps in zip(completions[: len(contexts)], logprobs[: len(contexts)], strict=True)
        ]
