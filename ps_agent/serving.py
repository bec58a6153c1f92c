"""What a client may choose: the operator's named models and corpora, and the graph ``langgraph.json`` serves.

Specs name server files, URLs and paid models (``hf:PATH``, ``vllm:URL``, ``provider:model``, a corpus path, a
retrieval server URL), so they are taken free-form only from trusted code: the Python API and the CLI. A client
of the served graph, or a per-request ``configurable`` of ``ParallelSearchAgent``, picks one of the *names* the
operator offers, and the operator maps each name to its spec:

    PS_AGENT_ALLOWED_LLMS="qwen0.5b, fast=vllm:http://gpu-1:8000/v1"
    PS_AGENT_ALLOWED_CORPORA="embedded, wiki=/srv/wiki-index"

A bare name is an embedded model (``ps-agent policies``) or the ``embedded`` corpus. Unset, the offer is every
embedded model and the embedded corpus. The first name is the default. Any other value is refused with the
names offered, and nothing is opened or contacted for it (docs/serving.md).

(No ``from __future__ import annotations`` here: the served context's field types are built at run time.)
"""

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from ps_agent.context import Context
from ps_agent.graph import compile_graph
from ps_agent.llms import EMBEDDED_SPECS, resolve_chat_model, resolve_text_policy, text_model_spec
from ps_agent.retrieval import EMBEDDED, resolve_retriever

logger = logging.getLogger(__name__)

ALLOWED_LLMS = "PS_AGENT_ALLOWED_LLMS"
ALLOWED_CORPORA = "PS_AGENT_ALLOWED_CORPORA"
_EMBEDDED = {"llm": EMBEDDED_SPECS, "corpus": (EMBEDDED,)}


class ChoiceError(ValueError):
    """A client asked for a model or corpus the operator does not offer."""


def _parse(variable: str, kind: str, text: str) -> dict[str, Any]:
    """``"a, b=SPEC"`` → ``{"a": "a", "b": "SPEC"}``: a bare name must be an embedded one."""
    offered: dict[str, Any] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, has_spec, spec = (part.strip() for part in entry.partition("="))
        if not name or (has_spec and not spec):
            raise ValueError(f"{variable}: bad entry {entry!r}: expected NAME or NAME=SPEC, separated by commas")
        if not has_spec and name not in _EMBEDDED[kind]:
            raise ValueError(
                f"{variable}: {name!r} is not an embedded {kind} ({', '.join(_EMBEDDED[kind])}): name it as NAME=SPEC"
            )
        offered[name] = spec if has_spec else name
    if not offered:
        raise ValueError(f"{variable} is set but names nothing: expected NAME or NAME=SPEC, separated by commas")
    return offered


@dataclass(frozen=True)
class Choices:
    """The models and corpora a client may pick, by name (name → spec or object); the first is the default."""

    llms: Mapping[str, Any] = field(default_factory=lambda: {name: name for name in EMBEDDED_SPECS})
    corpora: Mapping[str, Any] = field(default_factory=lambda: {EMBEDDED: EMBEDDED})

    def __post_init__(self) -> None:
        for kind, offered in (("llms", self.llms), ("corpora", self.corpora)):
            if not isinstance(offered, Mapping):
                raise ValueError(
                    f"Choices.{kind} must be a mapping of name to spec, e.g. {{'qwen0.5b': 'qwen0.5b'}}, "
                    f"got {type(offered).__name__}: {offered!r:.200}"
                )
            if not offered or not all(isinstance(name, str) and name for name in offered):
                raise ValueError(f"Choices.{kind} must map at least one non-empty name to a spec, got {offered!r:.200}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Choices":
        """The operator's offer from ``PS_AGENT_ALLOWED_LLMS`` and ``PS_AGENT_ALLOWED_CORPORA`` (unset: embedded)."""
        defaults = cls()
        llms = environ.get(ALLOWED_LLMS)
        corpora = environ.get(ALLOWED_CORPORA)
        return cls(
            llms=_parse(ALLOWED_LLMS, "llm", llms) if llms is not None else defaults.llms,
            corpora=_parse(ALLOWED_CORPORA, "corpus", corpora) if corpora is not None else defaults.corpora,
        )

    def pick(self, kind: Literal["llm", "corpus"], name: Any) -> Any:
        """The spec behind a client's ``name`` (None: the default), or a ``ChoiceError`` that lists the names
        offered and says nothing else: no file is opened and no URL contacted for a name not offered."""
        offered = self.llms if kind == "llm" else self.corpora
        if name is None:
            return next(iter(offered.values()))
        if isinstance(name, str) and name in offered:
            return offered[name]
        shown = repr(name) if isinstance(name, str) and len(name) <= 60 else f"a {type(name).__name__}"
        raise ChoiceError(f"{kind} {shown} is not offered here: choose one of {', '.join(offered)}")


def _resolved(kind: str, name: str | None, resolve: Any) -> Any:
    try:
        return resolve()
    except Exception as exc:
        logger.warning("the offered %s %r could not be used: %s: %s", kind, name, type(exc).__name__, exc)
        raise ChoiceError(
            f"{kind} {name or 'default'!r} cannot be used with these settings now (the server's log says why)"
        ) from None


def served_context(choices: Choices) -> type[Context]:
    """A ``Context`` whose ``llm`` and ``corpus`` are names from ``choices`` (Studio shows them as choices)."""
    llm_names = Literal[tuple(choices.llms)]  # type: ignore[valid-type]
    corpus_names = Literal[tuple(choices.corpora)]  # type: ignore[valid-type]

    @dataclass(frozen=True)
    class ServedContext(Context):
        __doc__ = Context.__doc__
        llm: llm_names | None = field(  # type: ignore[valid-type]
            default=None, metadata={"description": f"a model this server offers (default {next(iter(choices.llms))})"}
        )
        corpus: corpus_names | None = field(  # type: ignore[valid-type]
            default=None,
            metadata={"description": f"a corpus this server offers (default {next(iter(choices.corpora))})"},
        )

        def __post_init__(self) -> None:
            super().__post_init__()
            spec = choices.pick("llm", self.llm)
            choices.pick("corpus", self.corpus)
            if self.protocol == "tools" and text_model_spec(spec):
                raise ChoiceError(  # an embedded or local model: the client's choice, so the client may hear why
                    f"llm {self.llm or 'default'!r} is a text model, and protocol 'tools' needs a chat model with "
                    "tool calling: use protocol 'tags'" + (" or another llm" if len(choices.llms) > 1 else "")
                )

        @property
        def llm_spec(self) -> Any:
            return choices.pick("llm", self.llm)

        @property
        def corpus_spec(self) -> Any:
            return choices.pick("corpus", self.corpus)

        def failure(self, kind: str, reason: str) -> str:
            name = self.llm if kind == "llm" else self.corpus
            logger.warning("the offered %s %r failed: %s", kind, name, reason)
            return f"{kind} {name or 'default'!r} failed (the server's log says why)"

        # what an offered name resolves to: a failure names the client's choice only (the spec behind it may be
        # a private path or host), and the operator's log has the reason
        @cached_property
        def policy(self) -> Any:
            return _resolved("llm", self.llm, lambda: resolve_text_policy(self.llm_spec, self.mode))

        @cached_property
        def chat_model(self) -> Any:
            return _resolved("llm", self.llm, lambda: resolve_chat_model(self.llm_spec))

        @cached_property
        def retriever(self) -> Any:
            return _resolved("corpus", self.corpus, lambda: resolve_retriever(self.corpus_spec))

    return ServedContext


def served_graph(choices: Choices | None = None) -> Any:
    """The graph to serve (``langgraph.json``): a client's ``context`` (or ``configurable``) sets every setting
    within its bounds, and picks ``llm`` and ``corpus`` by name from ``choices`` (default: the environment's)."""
    return compile_graph(served_context(choices if choices is not None else Choices.from_env()))
