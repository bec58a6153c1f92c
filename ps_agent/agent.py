"""ParallelSearchAgent: the Runnable facade over the compiled graph."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import merge_configs
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph.state import CompiledStateGraph
from pydantic import BaseModel, Field

from ps_agent.configuration import AgentConfig
from ps_agent.graph import build_graph


class _Question(BaseModel):
    question: str = Field(
        description="A natural-language question; several independent parts are searched in parallel."
    )


class ParallelSearchAgent(Runnable[dict[str, Any], dict[str, Any]]):
    """A ParallelSearch agent: ``{"question": ...}`` → ``{"answer", "trajectory", "stats"}``.

    ``llm``: a LangChain chat model or LLM, or a spec string (``"smollm2"``, ``"hf:PATH"``,
    ``"vllm:http://HOST:PORT/v1"``, ``"provider:model"``); None is the embedded SmolLM2.
    ``retriever``: any ``Retriever``, a LangChain ``BaseRetriever``/``VectorStore``, or a corpus
    jsonl path; None is BM25 over the embedded Wikipedia summaries.
    Other keyword arguments are ``AgentConfig`` fields (``mode``, ``protocol``, ``max_turns``, …).
    """

    def __init__(self, llm: Any = None, retriever: Any = None, **config: Any) -> None:
        self.config = AgentConfig(**config)
        self.graph: CompiledStateGraph = build_graph(llm=llm, retriever=retriever, config=self.config)

    def _config(self, config: RunnableConfig | None) -> RunnableConfig:
        turns = self.config.with_overrides(config).max_turns
        # prepare + finish + per turn think and observe, with room for the forced turn
        defaults: RunnableConfig = {"max_concurrency": self.config.max_concurrency, "recursion_limit": 4 * turns + 10}
        return merge_configs(defaults, config)

    @staticmethod
    def _input(input: dict[str, Any] | str) -> dict[str, Any]:
        return {"question": input} if isinstance(input, str) else input

    def invoke(
        self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        return self.graph.invoke(self._input(input), self._config(config), **kwargs)

    async def ainvoke(
        self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        return await self.graph.ainvoke(self._input(input), self._config(config), **kwargs)

    def stream(self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        """The graph's stream: with the default ``stream_mode="updates"``, one item per node run."""
        kwargs.setdefault("stream_mode", "updates")
        yield from self.graph.stream(self._input(input), self._config(config), **kwargs)

    async def astream(
        self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        kwargs.setdefault("stream_mode", "updates")
        async for chunk in self.graph.astream(self._input(input), self._config(config), **kwargs):
            yield chunk

    def as_tool(
        self,
        name: str = "parallel_search",
        description: str = "Answer a factual question by searching a knowledge corpus, in parallel where the "
        "question has independent parts. Input: the question. Output: a short answer.",
        **_: Any,
    ) -> BaseTool:
        """This agent as a LangChain tool that takes a question and returns the answer text."""

        def answer(question: str) -> str:
            return self.invoke({"question": question})["answer"] or ""

        async def aanswer(question: str) -> str:
            return (await self.ainvoke({"question": question}))["answer"] or ""

        return StructuredTool.from_function(
            func=answer, coroutine=aanswer, name=name, description=description, args_schema=_Question
        )

    def __repr__(self) -> str:
        settings = {k: v for k, v in asdict(self.config).items() if k not in ("llm", "corpus")}
        return f"ParallelSearchAgent({settings})"
