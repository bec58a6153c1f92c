"""What every LLM backend shares: the ``TextPolicy`` interface, one turn's ``Completion``, the spec error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ps_agent.protocol import ChatPrompt
from ps_agent.state import Segment


class LLMSpecError(ValueError):
    """An LLM spec that names no usable backend."""


class ContextFull(ValueError):
    """A turn's context leaves no room in the model's window."""


@dataclass
class Completion:
    """One policy turn. ``token_ids``/``logprobs`` are set by token-exact backends only."""

    text: str
    prompt_text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None


@runtime_checkable
class TextPolicy(Protocol):
    """Writes the next turn after ``prompt`` (chat messages ending with the user prompt) and ``transcript``
    (the response so far)."""

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion: ...


def plain_text(prompt: ChatPrompt, transcript: Sequence[Segment]) -> str:
    """The prompt and response as one string, for backends without a chat template."""
    return "\n\n".join(m["content"] for m in prompt) + "".join(segment["text"] for segment in transcript)
