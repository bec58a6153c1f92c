"""The flags the training scripts share. The agent settings are derived from ``AgentConfig``: the same names,
types, defaults, ranges and help as the agent, the CLI and Studio, so a script's rollouts cannot drift from the
agent the policy is evaluated and served with (change a default in ``AgentConfig`` or in a run's config file).
``ModelArguments`` is the model both trainers start from: a base, with a new LoRA adapter or one to go on
training."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
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


#: The longest episode, in tokens, that gold.py keeps and run_sft.py trains by default (SmolLM2's runs): one number,
#: so that an episode too long is left out when gold is built, never cut in training (run_sft.py refuses one). The
#: Qwen runs set their own in both: 1664 parallel, 1536 sequential.
MAX_LENGTH = 896


@dataclass
class ModelArguments:
    """The model a trainer starts from (``--model_name_or_path``), and the LoRA adapter it trains: a new one
    (``--use_lora``, ``--lora_*``) or one trained before (``--init_adapter``)."""

    model_name_or_path: str = field(
        default="smollm2", metadata={"help": "an embedded base (smollm2, qwen0.5b; untrained) or a model folder"}
    )
    init_adapter: str | None = field(
        default=None,
        metadata={
            "help": "a PEFT LoRA adapter to go on training (e.g. policies/smollm2-parallelsearch; "
            "policies/qwen0.5b-parallelsearch with --model_name_or_path qwen0.5b); it must have been trained on "
            "--model_name_or_path, and its own LoRA config applies (--use_lora and --lora_* are ignored)"
        },
    )
    use_lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def new_lora(args: ModelArguments) -> Any:
    """The ``peft_config`` of a new LoRA adapter for the trainer, or None: with ``--init_adapter`` the adapter is
    the one loaded, and without ``--use_lora`` every weight trains."""
    if args.init_adapter or not args.use_lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules.split(","),
        task_type="CAUSAL_LM",
    )
