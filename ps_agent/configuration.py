"""Agent configuration: one typed dataclass, overridable per run through ``configurable``."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig

from ps_agent.protocol import Mode

ProtocolName = Literal["tags", "tools"]

#: each numeric setting's range, inclusive: a served graph takes these from its clients, so none may hold a
#: worker for long (seconds are floats, the rest integers; a search backoff of 0 is allowed, a rate of 0 is not)
BOUNDS: dict[str, tuple[float, float]] = {
    "max_turns": (1, 32),
    "topk": (1, 50),  # passages per sub-query in one observation: beyond this it floods the model's context
    "max_parallel": (1, 32),
    "max_new_tokens": (1, 1024),  # Search-R1 and the paper use 500 per turn
    "max_question_chars": (1, 20_000),
    "search_timeout_s": (0.001, 120.0),
    "search_retries": (0, 10),
    "search_backoff_s": (0.0, 30.0),
    "search_rate_limit": (1, 10_000),
    "max_concurrency": (1, 256),
    "run_timeout_s": (0.001, 3600.0),
}
OPTIONAL = {"search_rate_limit"}  # None: off
#: the fields that choose what the server reads or calls: free-form only from trusted code (see ps_agent.serving)
RESOURCES = ("llm", "corpus")


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
    protocol: ProtocolName = field(
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
        default=16,
        metadata={
            "description": "LangGraph's max_concurrency for ParallelSearchAgent, at each level: a batch's runs at "
            "once, and each run's searches at once (a batch can have its square in flight: search_rate_limit caps a "
            "backend); a served graph's run takes LangGraph's own, from the run's config"
        },
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

    run_timeout_s: float = field(
        default=600.0,
        metadata={"description": "seconds one run may take, its model turns and searches together"},
    )

    def __post_init__(self) -> None:
        if self.mode not in ("parallel", "sequential"):
            raise ValueError(f"mode must be 'parallel' or 'sequential', got {self.mode!r:.80}")
        if self.protocol not in ("tags", "tools"):
            raise ValueError(f"protocol must be 'tags' or 'tools', got {self.protocol!r:.80}")
        if not isinstance(self.demonstration, bool):
            raise ValueError(f"demonstration must be true or false, got {self.demonstration!r:.80}")
        if self.demonstration and self.protocol == "tools":
            raise ValueError(
                "demonstration is a one-shot demonstration of the tags protocol; the tools protocol has none: "
                "expected protocol 'tags' with demonstration, or demonstration false"
            )
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL:
                continue
            kind = float if name.endswith("_s") else int
            number = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
            if not number or isinstance(value, bool) or not (math.isfinite(value) and low <= value <= high):
                unit = "a number of seconds" if kind is float else "an integer"
                off = " (or unset, for no limit)" if name in OPTIONAL else ""
                raise ValueError(f"{name} must be {unit} from {low:g} to {high:g}{off}, got {value!r:.80}")

    @property
    def limits(self) -> RunnableConfig:
        """LangGraph's run limits for these settings: ``max_concurrency``, and a recursion limit that fits
        ``max_turns`` (prepare and finish, think and observe per turn, with room for the forced turn)."""
        return {"max_concurrency": self.max_concurrency, "recursion_limit": 4 * self.max_turns + 10}

    def with_overrides(self, config: RunnableConfig | None) -> AgentConfig:
        """This config with the known settings of ``config["configurable"]`` applied, ``RESOURCES`` aside (a
        per-request ``configurable`` picks those by name: ``ParallelSearchAgent`` and ``ps_agent.serving``)."""
        configurable = configurable_of(config)
        names = {f.name for f in fields(self)} - set(RESOURCES)
        overrides = {k: v for k, v in configurable.items() if k in names}
        return replace(self, **overrides) if overrides else self


def configurable_of(config: RunnableConfig | None) -> Mapping[str, Any]:
    """A run config's ``configurable`` (none: empty), refused unless it is a mapping."""
    configurable = (config or {}).get("configurable") or {}
    if not isinstance(configurable, Mapping):
        raise TypeError(f"config['configurable'] must be a mapping of settings, got {type(configurable).__name__}")
    return configurable


def unknown_setting(names: Iterable[str], known: Sequence[str]) -> str | None:
    """``unknown setting 'max_turn' (did you mean 'max_turns'?): expected some of [...]`` for the first of
    ``names`` not in ``known``; None when all are known."""
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown setting {str(name)[:60]!r}{hint}: expected some of {list(known)}"
    return None


def describe(name: str) -> str:
    """An ``AgentConfig`` field's description and range: the help of every option that sets it (the CLI, the
    training scripts), so no option can drift from the agent."""
    description = next(f.metadata["description"] for f in fields(AgentConfig) if f.name == name)
    low_high = BOUNDS.get(name)
    return str(description) + (f" ({low_high[0]:g} to {low_high[1]:g})" if low_high else "")
