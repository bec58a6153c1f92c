"""The agent settings the training scripts take as flags, derived from ``AgentConfig``: the same names, types,
defaults, ranges and help as the agent, the CLI and Studio, so a script's rollouts cannot drift from the agent
the policy is evaluated and served with. Change a default in ``AgentConfig`` or in a run's config file."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, field, fields, make_dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from ps_agent.configuration import AgentConfig, describe

#: the settings a rollout, a gold episode or a pass-rate sample is run with
AGENT_FLAGS = ("mode", "max_turns", "topk", "max_new_tokens")

_TYPES = get_type_hints(AgentConfig)
_DEFAULTS = {f.name: f.default for f in fields(AgentConfig) if f.default is not MISSING}

#: the flags as a dataclass for ``HfArgumentParser``/``TrlParser`` (``--max_turns``), to inherit from
AgentArguments = make_dataclass(
    "AgentArguments",
    [(name, _TYPES[name], field(default=_DEFAULTS[name], metadata={"help": describe(name)})) for name in AGENT_FLAGS],
)


def add_agent_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...] = AGENT_FLAGS) -> None:
    """The flags on an ``argparse`` parser, dashed (``--max-turns``)."""
    for name in names:
        kind = _TYPES[name]
        choices = get_args(kind) if get_origin(kind) is Literal else None
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=str if choices else kind,
            choices=choices,
            default=_DEFAULTS[name],
            help=describe(name),
        )


def agent_config(args: Any, **settings: Any) -> AgentConfig:
    """The ``AgentConfig`` of parsed flags (either parser's), with ``settings`` beside them: its checks apply."""
    return AgentConfig(**{name: getattr(args, name) for name in AGENT_FLAGS if hasattr(args, name)}, **settings)
