"""Agent configuration: one typed dataclass, overridable per run through ``configurable``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig

from ps_agent.protocol import Mode

Protocol = Literal["tags", "tools"]
MAX_TOPK = 50  # one observation is topk passages per sub-query: beyond this it floods the model's context


@dataclass(frozen=True)
class AgentConfig:
    """How the agent runs: each field can be set per run in ``config["configurable"]`` (or a LangGraph run's
    ``context``), and its description is what Studio shows.

    ``demonstration`` puts a one-shot demonstration before the prompt (not in the paper; for small
    untrained models). ``llm`` and ``corpus`` are specs (see ``ps_agent.llms`` and ``ps_agent.retrieval``) or
    objects; when unset, the embedded defaults.
    """

    mode: Mode = field(
        default="parallel",
        metadata={"description": "parallel: the paper's prompt, ## sub-queries; sequential: Search-R1's prompt"},
    )
    protocol: Protocol = field(
        default="tags",
        metadata={"description": "tags: <search>/<answer> text, token-exact; tools: native tool calling"},
    )
    max_turns: int = field(default=4, metadata={"description": "turns that may search, before one forced answer turn"})
    topk: int = field(default=3, metadata={"description": "passages per sub-query"})
    max_parallel: int = field(
        default=8, metadata={"description": "sub-queries searched per round; the rest are capped and the model is told"}
    )
    max_new_tokens: int = field(default=256, metadata={"description": "tokens per model turn"})
    max_question_chars: int = field(
        default=2000, metadata={"description": "longer questions are truncated, with a warning"}
    )
    search_timeout_s: float = field(default=10.0, metadata={"description": "seconds per search attempt"})
    search_retries: int = field(
        default=2, metadata={"description": "retries of a failed search, with exponential backoff"}
    )
    search_backoff_s: float = field(default=0.2, metadata={"description": "first backoff between retries, in seconds"})
    search_rate_limit: int | None = field(
        default=None, metadata={"description": "searches per second per retrieval backend (off when unset)"}
    )
    max_concurrency: int = field(
        default=16, metadata={"description": "LangGraph's max_concurrency: parallel searches and batch runs"}
    )
    demonstration: bool = field(
        default=False,
        metadata={"description": "a one-shot demonstration before the prompt (for small untrained models)"},
    )
    llm: Any = field(
        default=None,
        metadata={
            "description": "an LLM spec: qwen0.5b (default), smollm2, NAME-base, hf:PATH, vllm:URL, provider:model"
        },
    )
    corpus: Any = field(
        default=None,
        metadata={"description": "a retriever spec: embedded (default), a corpus jsonl, an index folder, a server URL"},
    )

    def __post_init__(self) -> None:
        if self.mode not in ("parallel", "sequential"):
            raise ValueError(f"mode must be 'parallel' or 'sequential', got {self.mode!r}")
        if self.protocol not in ("tags", "tools"):
            raise ValueError(f"protocol must be 'tags' or 'tools', got {self.protocol!r}")
        for name in ("max_turns", "topk", "max_parallel", "max_new_tokens", "max_question_chars", "max_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.topk > MAX_TOPK:
            raise ValueError(
                f"topk must be at most {MAX_TOPK} (passages per sub-query the model reads), got {self.topk}"
            )
        if not (math.isfinite(self.search_timeout_s) and self.search_timeout_s > 0):
            raise ValueError(f"search_timeout_s must be a finite number of seconds > 0, got {self.search_timeout_s!r}")
        if not (math.isfinite(self.search_backoff_s) and self.search_backoff_s >= 0) or self.search_retries < 0:
            raise ValueError(
                f"search_retries and search_backoff_s must be finite and >= 0, got {self.search_retries!r} "
                f"and {self.search_backoff_s!r}"
            )

    @property
    def limits(self) -> RunnableConfig:
        """LangGraph's run limits for these settings: ``max_concurrency``, and a recursion limit that fits
        ``max_turns`` (prepare and finish, think and observe per turn, with room for the forced turn)."""
        return {"max_concurrency": self.max_concurrency, "recursion_limit": 4 * self.max_turns + 10}

    def with_overrides(self, config: RunnableConfig | None) -> AgentConfig:
        """This config with the known keys of ``config["configurable"]`` applied."""
        configurable = (config or {}).get("configurable", {})
        names = {f.name for f in fields(self)}
        overrides = {k: v for k, v in configurable.items() if k in names}
        return replace(self, **overrides) if overrides else self
