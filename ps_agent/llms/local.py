"""A local transformers causal LM as a token-exact policy (the embedded default and ``hf:PATH``)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ps_agent.batching import MicroBatcher
from ps_agent.llms.base import Completion, ContextFull, LLMSpecError
from ps_agent.llms.tokens import chat_prompt_ids, context_ids, generated_length
from ps_agent.protocol import ChatPrompt
from ps_agent.state import Segment


@dataclass(frozen=True)
class _Turn:
    """One turn to generate: its context ids and how it stops."""

    context: list[int]
    stop: tuple[str, ...]
    max_tokens: int


def _generation_thread() -> ThreadPoolExecutor:
    """One thread for a policy's turns, started by the first turn submitted to it."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-agent-generate")


class TransformersPolicy:
    """A local causal LM: the prompt through its chat template, the response as exact token ids.

    With ``expected`` > 1 (set by a training rollout to the number of active rollouts), concurrent
    ``acomplete`` calls on one event loop are gathered, until ``expected`` turns wait or ``batch_window_s``
    passes, and generated as one left-padded batch per stop set.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_window_s: float = 2.0,
        autocast: Any = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.autocast = autocast  # a dtype (torch.bfloat16): generate under autocast, as a bf16 training run trains
        self.batch_sizes: list[int] = []  # sizes of the batches generated, for inspection
        self._lock = threading.Lock()  # one generate() at a time: a CPU model gains nothing from more
        self._thread = _generation_thread()  # where acomplete's turns are generated, off the event loop
        self._batcher: MicroBatcher[_Turn, Completion] = MicroBatcher(
            self._generate_turns, size=1, max_wait_s=batch_window_s
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> TransformersPolicy:
        """The model and tokenizer of a transformers model folder."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not path.exists():
            raise LLMSpecError(
                f"hf: model path not found: {path} (expected a transformers model folder or a PEFT adapter folder)"
            )
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    @property
    def expected(self) -> int:
        """How many concurrent turns make a batch (the active rollouts); 1 generates each turn alone."""
        return self._batcher.size

    @expected.setter
    def expected(self, count: int) -> None:
        self._batcher.size = count

    @property
    def batch_window_s(self) -> float:
        """The longest a turn waits for others to join its batch."""
        return self._batcher.max_wait_s

    @batch_window_s.setter
    def batch_window_s(self, seconds: float) -> None:
        self._batcher.max_wait_s = seconds

    def prompt_ids(self, prompt: ChatPrompt) -> list[int]:
        """The chat prompt's ids."""
        return chat_prompt_ids(self.tokenizer, prompt)

    def context_ids(self, prompt: ChatPrompt, transcript: Sequence[Segment]) -> list[int]:
        """The ids the next turn is conditioned on; a context that fills the model's window is refused (served
        settings within their bounds, ``topk`` 50 × ``max_parallel`` 32, read 180k tokens into a 32k window)."""
        ids = context_ids(self.tokenizer, prompt, transcript)
        window = getattr(self.model.config, "max_position_embeddings", None)
        if window and len(ids) >= window:
            raise ContextFull(
                f"the context of {len(ids)} tokens fills the model's window ({window} positions): fewer turns, "
                "sub-queries or passages (topk, max_parallel, max_turns)"
            )
        return ids

    def generate(self, contexts: list[list[int]], stop: Sequence[str], max_tokens: int) -> list[Completion]:
        """One left-padded batch of generations, each stopping at EOS, a stop string or ``max_tokens``."""
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(c) for c in contexts)
        device = self.model.device  # a model moved to a GPU generates there
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], device=device)
        attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device)
        sample = self.temperature > 0
        precision = torch.autocast(device.type, dtype=self.autocast, enabled=self.autocast is not None)
        with self._lock, torch.no_grad(), precision:
            out = self.model.generate(
                input_ids,
                attention_mask=attention,
                max_new_tokens=max_tokens,
                do_sample=sample,
                temperature=self.temperature if sample else None,
                top_p=self.top_p if sample else None,
                top_k=None,
                stop_strings=list(stop),
                tokenizer=self.tokenizer,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_scores=True,
            )
            logprobs = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        self.batch_sizes.append(len(contexts))
        completions = []
        for row, context in enumerate(contexts):
            new = out.sequences[row, width:].tolist()
            n = generated_length(self.tokenizer, new, stop)
            ids = new[:n]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            stopped = bool(ids) and (ids[-1] == self.tokenizer.eos_token_id or any(s in text for s in stop))
            completions.append(
                Completion(
                    text=text,
                    prompt_text=self.tokenizer.decode(context),
                    prompt_tokens=len(context),
                    completion_tokens=len(ids),
                    token_ids=ids,
                    logprobs=[float(x) for x in logprobs[row, :n].tolist()],
                    finish_reason="stop" if stopped else "length",
                )
            )
        return completions

    def complete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        """The next turn, generated now on this thread."""
        return self.generate([self.context_ids(prompt, transcript)], stop, max_tokens)[0]

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        """The next turn, in a batch with the concurrent turns when ``expected`` > 1."""
        turn = _Turn(self.context_ids(prompt, transcript), tuple(stop), max_tokens)
        if self.expected <= 1:
            (completion,) = await self._batcher.run_now([turn])
        else:
            (completion,) = await self._batcher.submit([turn])
        return completion

    async def _generate_turns(self, turns: list[_Turn]) -> list[Completion]:
        """Generate gathered turns, one batch per (stop strings, max_tokens), off the event loop."""
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for i, turn in enumerate(turns):
            groups.setdefault((turn.stop, turn.max_tokens), []).append(i)
        done: dict[int, Completion] = {}
        for (stop, max_tokens), rows in groups.items():
            contexts = [turns[i].context for i in rows]
            call = contextvars.copy_context().run  # the caller's context variables, as asyncio.to_thread passes them
            generated = await asyncio.get_running_loop().run_in_executor(
                self._thread, call, self.generate, contexts, stop, max_tokens
            )
            done.update(zip(rows, generated, strict=True))
        return [done[i] for i in range(len(turns))]

    def close(self) -> None:
        """Wait for the generation thread to finish its turn and stop it, so that nothing but this object holds the
        model any more. The policy stays usable: its next ``acomplete`` starts a new thread."""
        thread, self._thread = self._thread, _generation_thread()
        thread.shutdown(wait=True)
