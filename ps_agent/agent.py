"""ParallelSearchAgent: the Runnable facade over the compiled graph."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import get_config_list, merge_configs
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from ps_agent.configuration import RESOURCES, AgentConfig, configurable_of, unknown_setting
from ps_agent.context import Context
from ps_agent.graph import graph_for
from ps_agent.runner import run_sync
from ps_agent.serving import Choices


class _Question(BaseModel):
    question: str = Field(
        description="A natural-language question; several independent parts are searched in parallel."
    )


class ParallelSearchAgent(Runnable[dict[str, Any], dict[str, Any]]):
    """A ParallelSearch agent: ``{"question": ...}`` → ``{"answer", "trajectory", "stats"}``.

    ``llm``: a LangChain chat model or LLM, or a spec string (``"qwen0.5b"``, ``"smollm2"``, ``"hf:PATH"``,
    ``"vllm:http://HOST:PORT/v1"``, ``"provider:model"``); None is the embedded default policy of the mode
    (Qwen2.5-Coder-0.5B-Instruct with its shipped adapter; ``ps-agent policies`` lists them).
    ``retriever``: any ``Retriever``, a LangChain ``BaseRetriever``/``VectorStore``, or a corpus
    jsonl path; None is BM25 over the embedded Wikipedia summaries.
    Other keyword arguments are ``AgentConfig`` fields (``mode``, ``protocol``, ``max_turns``, …).

    A run's ``config["configurable"]`` sets any of those fields within its bounds. It picks ``llm`` and ``corpus``
    only by name from ``choices`` (a ``Choices``: name → spec or object; default: the operator's environment,
    ``PS_AGENT_ALLOWED_LLMS``/``PS_AGENT_ALLOWED_CORPORA``, else the embedded ones), never as a free-form spec.
    ``configurable_prefix`` (e.g. ``"research_"``): the agent reads only the keys that carry it (``research_mode``,
    ``research_llm``), as a ``ConfigurableField`` id is chosen, so a parent app's own ``mode`` or ``llm`` stays
    its own; a prefixed key that names no setting is refused.
    """

    def __init__(
        self,
        llm: Any = None,
        retriever: Any = None,
        *,
        choices: Choices | None = None,
        configurable_prefix: str = "",
        **config: Any,
    ) -> None:
        if choices is not None and not isinstance(choices, Choices):
            raise TypeError(f"choices must be a ps_agent.serving.Choices, got {type(choices).__name__}")
        if not isinstance(configurable_prefix, str):
            raise TypeError(f"configurable_prefix must be a string, got {type(configurable_prefix).__name__}")
        self.configurable_prefix = configurable_prefix
        if wrong := unknown_setting(config, [f.name for f in fields(AgentConfig) if f.name not in RESOURCES]):
            raise TypeError(f"ParallelSearchAgent got an {wrong}")
        self.context = Context(**{"llm": llm, "corpus": retriever} | config)
        self.choices = choices if choices is not None else Choices.from_env()
        #: the compiled graph with this agent's context and run limits bound: it runs alone or as a subgraph
        self.graph: Runnable[dict[str, Any], dict[str, Any]] = graph_for(self.context)

    @classmethod
    def from_config(
        cls, config: AgentConfig, *, choices: Choices | None = None, configurable_prefix: str = ""
    ) -> ParallelSearchAgent:
        """The agent of an ``AgentConfig``, its ``llm`` and ``corpus`` included."""
        settings = {f.name: getattr(config, f.name) for f in fields(AgentConfig)}
        llm, corpus = settings.pop("llm"), settings.pop("corpus")
        return cls(llm, corpus, choices=choices, configurable_prefix=configurable_prefix, **settings)

    def _settings(self, config: RunnableConfig | None) -> RunnableConfig:
        """The run's settings as ``{"configurable": {...}}``: its ``configurable``, or with a
        ``configurable_prefix`` only the keys that carry it, the prefix taken off."""
        configurable = configurable_of(config)
        prefix = self.configurable_prefix
        if not prefix:
            return {"configurable": dict(configurable)}
        settings = {k[len(prefix) :]: v for k, v in configurable.items() if isinstance(k, str) and k.startswith(prefix)}
        known = [f.name for f in fields(AgentConfig)]
        if wrong := unknown_setting(settings, known):
            raise ValueError(f"a configurable key after the agent's prefix {prefix!r} names an {wrong}")
        return {"configurable": settings}

    def _run(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> tuple[RunnableConfig, Context]:
        """The run's config and context: the agent's, with ``config["configurable"]``'s settings applied and its
        ``llm``/``corpus`` names looked up in ``choices``."""
        if "context" in kwargs:
            raise TypeError(
                "ParallelSearchAgent builds each run's context itself: pass its settings to the constructor, or per "
                "run as config={'configurable': {...}} (mode, max_turns, …); "
                f"got context={kwargs['context']!r:.80}"
            )
        settings = self._settings(config)
        context = self.context.with_overrides(settings)
        configurable = settings["configurable"]  # a name of None picks nothing: the agent's own stays
        picked = {
            kind: self.choices.pick(kind, configurable[kind])
            for kind in RESOURCES
            if configurable.get(kind) is not None
        }
        if picked:
            context = replace(context, **picked)
        return merge_configs(context.limits, config), context

    @staticmethod
    def _input(input: dict[str, Any] | str | BaseMessage | Sequence[BaseMessage]) -> dict[str, Any]:
        """The graph's input: ``{"question": ...}`` as given, or a question given as text, or as a chat's messages
        or a prompt template's value (the last human message's text), as a LangChain chain passes them."""
        if isinstance(input, Mapping):
            if "question" not in input:
                raise ValueError(
                    f"the input has no 'question' (it holds {sorted(map(str, input))}): expected {{'question': str}}"
                )
            return dict(input)
        if isinstance(input, str):
            return {"question": input}
        if isinstance(input, PromptValue):  # a prompt template's output: ``prompt | agent``
            input = input.to_messages()
        messages = [input] if isinstance(input, BaseMessage) else input
        if isinstance(messages, Sequence) and messages and all(isinstance(m, BaseMessage) for m in messages):
            human = [m for m in messages if isinstance(m, HumanMessage)]
            if human:
                return {"question": human[-1].text}
            raise ValueError("the messages hold no human message: expected the question as a HumanMessage")
        raise TypeError(
            f"expected a question string, {{'question': str}} or chat messages, got {type(input).__name__}: "
            f"{input!r:.80}"
        )

    def invoke(
        self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """``ainvoke`` on the shared event loop (``run_sync``): one hop to the loop per run, where the graph's own
        sync ``invoke`` takes one per node."""
        return run_sync(self.ainvoke(input, config, **kwargs))

    async def ainvoke(
        self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        config, context = self._run(config, kwargs)
        return await self.graph.ainvoke(self._input(input), config, context=context, **kwargs)

    def stream(self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        """The graph's stream: with the default ``stream_mode="updates"``, one item per node run."""
        kwargs.setdefault("stream_mode", "updates")
        config, context = self._run(config, kwargs)
        yield from self.graph.stream(self._input(input), config, context=context, **kwargs)

    async def astream(
        self, input: dict[str, Any] | str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        kwargs.setdefault("stream_mode", "updates")
        config, context = self._run(config, kwargs)
        async for chunk in self.graph.astream(self._input(input), config, context=context, **kwargs):
            yield chunk

    def transform(self, input: Iterator[Any], config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        """In a chain's stream (``agent | step``, ``agent.pick("answer")``): the run's output, once, as the next
        step expects it (``stream`` itself yields the graph's node updates)."""
        yield self.invoke(_last(input), config, **kwargs)

    async def atransform(
        self, input: AsyncIterator[Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        yield await self.ainvoke(_last([chunk async for chunk in input]), config, **kwargs)

    def batch(
        self, inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Runs at once: at most the config's ``max_concurrency`` (LangChain's, else its ``configurable``'s), else
        the agent's."""
        _check_batch(inputs)
        return super().batch(inputs, self._batch_configs(config, len(inputs)), **kwargs)

    async def abatch(
        self, inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None = None, **kwargs: Any
    ) -> list[Any]:
        _check_batch(inputs)
        return await super().abatch(inputs, self._batch_configs(config, len(inputs)), **kwargs)

    def _batch_configs(self, config: RunnableConfig | list[RunnableConfig] | None, n: int) -> list[RunnableConfig]:
        configs = get_config_list(config, n)
        return [c if c.get("max_concurrency") is not None else c | {"max_concurrency": self._limit(c)} for c in configs]

    def _limit(self, config: RunnableConfig) -> int:
        """A run's ``max_concurrency``: its ``configurable``'s, else the agent's (a bad setting is the run's error)."""
        try:
            return self.context.with_overrides(self._settings(config)).max_concurrency
        except (TypeError, ValueError):
            return self.context.max_concurrency

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        """``{"question": str}``: what Studio-like clients and ``as_tool`` on a wrapped agent
        (``agent.with_retry().as_tool()``) build their forms and arguments from."""
        return _Question

    def as_tool(
        self,
        args_schema: Any = None,
        *,
        name: str | None = None,
        description: str | None = None,
        arg_types: Any = None,
    ) -> BaseTool:
        """This agent as a LangChain tool that takes a question and returns the answer text; a call's config
        (``configurable`` settings, callbacks) reaches the run. ``Runnable.as_tool``'s signature: its input is
        always ``{"question": str}``, so another ``args_schema`` or ``arg_types`` is refused, not ignored."""
        if args_schema is not None or arg_types is not None:
            raise TypeError("as_tool takes no args_schema or arg_types: the tool's input is {'question': str}")
        name = name or "parallel_search"
        description = description or (
            "Answer a factual question by searching a knowledge corpus, in parallel where the question has "
            "independent parts. Input: the question. Output: a short answer."
        )

        # LangChain hands a tool function the caller's config (its configurable settings, callbacks, tags)
        def answer(question: str, config: RunnableConfig) -> str:
            return self.invoke({"question": question}, config)["answer"] or ""

        async def aanswer(question: str, config: RunnableConfig) -> str:
            return (await self.ainvoke({"question": question}, config))["answer"] or ""

        return StructuredTool.from_function(
            func=answer, coroutine=aanswer, name=name, description=description, args_schema=_Question
        )

    def __repr__(self) -> str:
        settings = {
            f.name: getattr(self.context, f.name) for f in fields(self.context) if f.name not in ("llm", "corpus")
        }
        return f"ParallelSearchAgent({settings})"


def _last(chunks: Iterable[Any]) -> Any:
    """The input a chain streams in: its chunks added up where they add (text), else the last one."""
    final = None
    for chunk in chunks:
        try:
            final = chunk if final is None else final + chunk
        except TypeError:
            final = chunk
    return final


def _check_batch(inputs: Any) -> None:
    """``batch`` takes a list of inputs: a string would run one question per character."""
    if isinstance(inputs, (str, Mapping)):
        raise TypeError(f"batch takes a list of questions, got one {type(inputs).__name__}: {inputs!r:.80}")
