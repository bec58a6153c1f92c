"""The graph's runtime context: the agent's settings plus the model and retriever they name.

Every node reads ``runtime.context`` (LangGraph's ``context_schema``), so Studio shows the settings and a run
sets them with ``graph.invoke(input, context={"mode": "sequential"})`` or ``context=Context(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from ps_agent.configuration import AgentConfig
from ps_agent.llms import TextPolicy, resolve_chat_model, resolve_text_policy
from ps_agent.retrieval import Retriever, resolve_retriever


@dataclass(frozen=True)
class Context(AgentConfig):
    """``AgentConfig`` and what its ``llm`` and ``corpus`` resolve to, resolved on first use and kept with the
    context (an agent keeps one for all its runs; a run with other settings gets its own)."""

    @property
    def llm_spec(self) -> Any:
        """What ``llm`` names: itself here; a served graph's context maps a client's choice to the operator's spec."""
        return self.llm

    @property
    def corpus_spec(self) -> Any:
        return self.corpus

    @cached_property
    def policy(self) -> TextPolicy:
        """The model of the tags protocol."""
        return resolve_text_policy(self.llm_spec, self.mode)

    @cached_property
    def chat_model(self) -> BaseChatModel:
        """The model of the tools protocol: a chat model with tool calling."""
        return resolve_chat_model(self.llm_spec)

    @cached_property
    def retriever(self) -> Retriever:
        return resolve_retriever(self.corpus_spec)

    def failure(self, kind: str, reason: str) -> str:
        """What a run reports when its ``llm`` or ``corpus`` (``kind``) failed: the reason itself here; a served
        context names the client's choice instead, since the reason may hold the private host behind it."""
        return reason

    @property
    def backend(self) -> object:
        """What ``search_rate_limit`` limits: the object given as ``corpus`` (a LangChain retriever, not the
        adapter around it), or the retriever a spec names (one per spec)."""
        corpus = self.corpus_spec
        return self.retriever if corpus is None or isinstance(corpus, (str, Path)) else corpus
