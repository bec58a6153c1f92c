"""Agent configuration: one typed dataclass, overridable per run through ``configurable``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig

from ps_agent.protocol import Mode

Protocol = Literal["tags", "tools"]
MAX_TOPK = 50  # one observation is topk passages per sub-query: beyond this it floods the model's context


@dataclass(frozen=True)
class AgentConfig:
    """How the agent runs. Every field can be set per run in ``config["configurable"]``.

    ``demonstration`` puts a one-shot demonstration before the prompt (not in the paper; for small
    untrained models). ``llm`` and ``corpus`` are specs (see ``ps_agent.llms`` and ``ps_agent.retrieval``); when
    unset, the agent's own model and retriever are used, or the embedded defaults.
    """

    mode: Mode = "parallel"
    protocol: Protocol = "tags"
    max_turns: int = 4
    topk: int = 3
    max_parallel: int = 8
    max_new_tokens: int = 256
    max_question_chars: int = 2000
    search_timeout_s: float = 10.0
    search_retries: int = 2
    search_backoff_s: float = 0.2
    search_rate_limit: int | None = None
    max_concurrency: int = 16
    demonstration: bool = False
    llm: Any = None
    corpus: Any = None

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

    def with_overrides(self, config: RunnableConfig | None) -> AgentConfig:
        """This config with the known keys of ``config["configurable"]`` applied."""
        configurable = (config or {}).get("configurable", {})
        names = {f.name for f in fields(self)}
        overrides = {k: v for k, v in configurable.items() if k in names}
        return replace(self, **overrides) if overrides else self
