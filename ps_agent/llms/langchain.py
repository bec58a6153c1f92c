"""Any LangChain model as a tags-protocol policy: a ``BaseLLM`` on plain text, a ``BaseChatModel`` on chat turns."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel, BaseLanguageModel, BaseLLM
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import ensure_config

from ps_agent.llms.base import Completion, plain_text
from ps_agent.protocol import ChatPrompt, close_action
from ps_agent.state import Segment


def token_cap(model: BaseLanguageModel, max_tokens: int) -> dict[str, int]:
    """``max_tokens`` as a call keyword, for models with LangChain's standard ``max_tokens`` parameter (the
    OpenAI, Anthropic, vLLM, … integrations); a model without it is called as it is."""
    return {"max_tokens": max_tokens} if "max_tokens" in type(model).model_fields else {}


def cut_at_token_limit(finish_reason: str | None, metadata: dict) -> bool:
    """Whether a model stopped at its token limit rather than on a stop sequence: OpenAI's and vLLM's
    ``finish_reason`` "length", Anthropic's ``stop_reason`` "max_tokens", Ollama's ``done_reason`` "length"."""
    reasons = {finish_reason, metadata.get("stop_reason"), metadata.get("done_reason")}
    return bool(reasons & {"length", "max_tokens"})


class LangChainLLMPolicy:
    """Any LangChain ``BaseLLM``: the prompt and response as one plain string."""

    def __init__(self, llm: BaseLLM) -> None:
        self.llm = llm

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        """The next turn, completed from the plain text so far; the run's callbacks, tags and metadata (LangChain's
        current config, as ``ainvoke`` reads it) reach the call, which ``agenerate`` alone would not pass on."""
        prompt_text = plain_text(prompt, transcript)
        config = ensure_config()
        traced = {key: config.get(key) for key in ("callbacks", "tags", "metadata", "run_name")}
        result = await self.llm.agenerate([prompt_text], stop=list(stop), **traced, **token_cap(self.llm, max_tokens))
        generation = result.generations[0][0]
        usage = (result.llm_output or {}).get("token_usage", {})
        info = generation.generation_info or {}
        finish_reason = info.get("finish_reason")
        return Completion(
            text=close_action(generation.text, stopped=not cut_at_token_limit(finish_reason, info)),
            prompt_text=prompt_text,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=finish_reason,
        )


def transcript_messages(prompt: ChatPrompt, transcript: Sequence[Segment]) -> list[BaseMessage]:
    """The prompt and response as chat turns: model text → AI, environment text → human."""
    roles = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}
    messages: list[BaseMessage] = [roles[m["role"]](m["content"]) for m in prompt]
    for segment in transcript:
        kind = AIMessage if segment["role"] == "model" else HumanMessage
        if isinstance(messages[-1], kind):
            messages[-1] = kind(messages[-1].content + segment["text"])
        else:
            messages.append(kind(segment["text"]))
    return messages


class LangChainChatPolicy:
    """Any LangChain ``BaseChatModel`` speaking the tags protocol as alternating chat turns."""

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        """The next turn, as the chat model's reply to the conversation so far."""
        messages = transcript_messages(prompt, transcript)
        message = await self.model.ainvoke(messages, stop=list(stop), **token_cap(self.model, max_tokens))
        usage = message.usage_metadata or {}
        finish_reason = message.response_metadata.get("finish_reason")
        return Completion(
            text=close_action(message.text, stopped=not cut_at_token_limit(finish_reason, message.response_metadata)),
            prompt_text=plain_text(prompt, transcript),
            prompt_tokens=usage.get("input_tokens"),
            completion_tokens=usage.get("output_tokens"),
            finish_reason=finish_reason,
        )
