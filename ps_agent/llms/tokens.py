"""Token ids of a turn's context: the chat prompt, then each segment's own ids (model text is never re-tokenised)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ps_agent.llms.base import plain_text
from ps_agent.protocol import ChatPrompt
from ps_agent.state import Segment


def chat_prompt_ids(tokenizer: Any, prompt: ChatPrompt) -> list[int]:
    """The chat prompt through the tokenizer's chat template (if it has one), as ids."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    else:
        text = plain_text(prompt, [])
    return tokenizer(text, add_special_tokens=False).input_ids


def segment_ids(tokenizer: Any, segment: Segment) -> list[int]:
    """A model turn's own ids, or the tokenisation of environment text (never model text re-tokenised)."""
    if segment["token_ids"] is not None:
        return list(segment["token_ids"])
    return tokenizer(segment["text"], add_special_tokens=False).input_ids


def context_ids(tokenizer: Any, prompt: ChatPrompt, transcript: Sequence[Segment]) -> list[int]:
    """What the model is conditioned on: prompt ids, then each segment's ids."""
    ids = chat_prompt_ids(tokenizer, prompt)
    for segment in transcript:
        ids.extend(segment_ids(tokenizer, segment))
    return ids


def generated_length(tokenizer: Any, new: list[int], stop: Sequence[str]) -> int:
    """How many of ``new`` tokens belong to the turn: through EOS or the token that completes the first
    stop string (batch rows and backends without stop strings run on past it)."""
    for j, token in enumerate(new):
        if token == tokenizer.eos_token_id:
            return j + 1
        if ">" in tokenizer.decode([token]) and any(s in tokenizer.decode(new[: j + 1]) for s in stop):
            return j + 1
    return len(new)
