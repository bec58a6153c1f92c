"""Token ids of a turn's context: the chat prompt, then each segment's own ids (model text is never re-tokenised),
and of a whole trajectory (``token_sequences``: what a GRPO rollout trains on and a gold episode holds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ps_agent.llms.base import plain_text
from ps_agent.protocol import ChatPrompt
from ps_agent.state import Segment


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """The texts ``tokenizer`` reads as one special token (``<|im_end|>``, ``<|endoftext|>``, ``<filename>``, …)."""
    return tuple(token.content for token in tokenizer.added_tokens_decoder.values() if token.special)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` as plain text: a special token's string in it (a passage holding ``<|im_end|>``) is spelled out
    in ordinary tokens, never read as the control token."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids


def _render(tokenizer: Any, prompt: ChatPrompt) -> str:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    return plain_text(prompt, [])


def chat_prompt_ids(tokenizer: Any, prompt: ChatPrompt) -> list[int]:
    """The chat prompt through the tokenizer's chat template (if it has one), as ids. Only the template's own
    special tokens are special: where a message holds a special token's string, each message is tokenised as
    plain text between the template's pieces (otherwise, as usual, the rendered prompt in one go)."""
    specials = special_strings(tokenizer)
    if not any(special in message["content"] for message in prompt for special in specials):
        return tokenizer(_render(tokenizer, prompt), add_special_tokens=False).input_ids
    marks = [f"\ue000{i}\ue001" for i in range(len(prompt))]
    rest = _render(tokenizer, [{**message, "content": mark} for message, mark in zip(prompt, marks, strict=True)])
    ids: list[int] = []
    for message, mark in zip(prompt, marks, strict=True):
        template, _, rest = rest.partition(mark)
        ids += tokenizer(template, add_special_tokens=False).input_ids + text_ids(tokenizer, message["content"])
    return ids + tokenizer(rest, add_special_tokens=False).input_ids


def segment_ids(tokenizer: Any, segment: Segment) -> list[int]:
    """A model turn's own ids, or the tokenisation of environment text as plain text (never model text
    re-tokenised; a passage's ``<|im_end|>`` is text, not the control token)."""
    if segment["token_ids"] is not None:
        return list(segment["token_ids"])
    return text_ids(tokenizer, segment["text"])


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
