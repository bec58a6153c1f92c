"""Any PEFT LoRA adapter on its base model, checked before it loads: the adapter of an ``hf:PATH`` spec, a
trainer's ``--init_adapter``, a teacher. An adapter trained on another base, or whose weights do not fill the LoRA
modules it declares, is refused with both named. An adapter recording an embedded base's folder loads on that
base (``ps_agent.llms.embedded``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from ps_agent.llms.base import LLMSpecError
from ps_agent.llms.embedded import EMBEDDED_BASES, embedded_model_path


def same_base(recorded: str | Path, base: str | Path) -> bool:
    """Whether the base model an adapter records is ``base``: the same folder name (an embedded base is recorded
    by name, so an adapter travels), and where both are folders here, the same folder: a name tells no model apart
    (every run saves to ``final``; ``merged``), nor does a config (two fine-tunes of one base share it)."""
    recorded, base = Path(recorded), Path(base)
    if recorded.name != base.name:
        return False
    here = recorded.is_absolute() and recorded.exists() and base.exists()  # a bare name is not a folder of this one
    return not here or recorded.resolve() == base.resolve()


def adapter_base(adapter: str | Path, base: str | Path | None = None) -> Path:
    """The base model folder of a PEFT LoRA adapter, checked: ``base`` defaults to the adapter's recorded base
    (an embedded model when it names one's folder). A missing or incomplete adapter folder, or an adapter
    trained on another base, is refused with both named."""
    adapter = Path(adapter)
    config_file = adapter / "adapter_config.json"
    if not config_file.is_file() or not (adapter / "adapter_model.safetensors").is_file():
        raise LLMSpecError(
            f"adapter folder {adapter} is missing or incomplete: expected adapter_config.json and "
            "adapter_model.safetensors (a PEFT LoRA adapter, e.g. training/run_sft.py's OUTPUT_DIR/final)"
        )
    try:
        recorded = json.loads(config_file.read_text())["base_model_name_or_path"]
    except (json.JSONDecodeError, KeyError, TypeError):
        recorded = None
    if not isinstance(recorded, str) or not recorded:
        raise LLMSpecError(
            f"{config_file} does not name its base model: expected a JSON object with a string "
            "'base_model_name_or_path', as PEFT saves it"
        )
    if base is None:
        embedded = {b.folder: b for b in EMBEDDED_BASES.values()}.get(Path(recorded).name)
        base = embedded_model_path(embedded) if embedded else Path(recorded)
    base = Path(base)
    if not same_base(recorded, base):
        raise LLMSpecError(
            f"adapter {adapter} was trained on base model {recorded!r}, but the base model given is {str(base)!r}"
        )
    if not base.exists():
        raise LLMSpecError(f"base model {base} of adapter {adapter} not found (expected a transformers model folder)")
    return base


def _adapter_keys(adapter: Path) -> set[str]:
    """The tensor names of an adapter's weights file, or a one-line error for a damaged one."""
    from safetensors import safe_open

    weights = adapter / "adapter_model.safetensors"
    try:
        with safe_open(weights, framework="pt") as opened:
            return set(opened.keys())
    except Exception as exc:  # safetensors raises its own SafetensorError, or OSError, for a torn file
        raise LLMSpecError(
            f"adapter weights {weights} cannot be read ({type(exc).__name__}: {str(exc)[:120]}): expected a whole "
            "safetensors file, e.g. as training/run_sft.py writes it; was it truncated or damaged in a copy?"
        ) from exc


def peft_adapter(adapter: str | Path, base: str | Path | None = None, *, trainable: bool = False) -> Any:
    """A PEFT LoRA adapter on its base model (``adapter_base`` checks the pair), refused unless its weights
    fill every LoRA module it declares and nothing else: PEFT only warns when names match no module, and the
    adapter then changes nothing, or changes only some layers."""
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    adapter, base = Path(adapter), adapter_base(adapter, base)
    stored = _adapter_keys(adapter)
    with warnings.catch_warnings():  # PEFT's warning lists every missing key; the error below says what matters
        warnings.filterwarnings("ignore", message="Found missing adapter keys", category=UserWarning)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter, is_trainable=trainable)
        # PEFT reads the base's config to see whether its vocabulary changed: at the base an adapter records, which
        # for an embedded one is a name, looked up on the Hub on every load; here, at the base it loaded on
        configs = model.peft_config.values()
        recorded = [config.base_model_name_or_path for config in configs]
        for config in configs:
            config.base_model_name_or_path = str(base)
        expected = set(get_peft_model_state_dict(model))  # the names PEFT saves (LoRA, DoRA, modules_to_save)
        for config, name in zip(configs, recorded, strict=True):
            config.base_model_name_or_path = name  # saved again, the adapter records its base as it did
    unmatched, unfilled = sorted(stored - expected), sorted(expected - stored)
    if unmatched or unfilled:
        raise LLMSpecError(
            f"adapter {adapter} does not fit its base model {base}: {len(unmatched)} of its {len(stored)} tensors "
            f"match no LoRA module (e.g. {unmatched[:3]}), and {len(unfilled)} of the {len(expected)} LoRA "
            f"weights it declares have no tensor (e.g. {unfilled[:3]}); expected an adapter saved by PEFT for "
            "this base with every target module"
        )
    return model


def load_adapter_model(adapter: str | Path, base: str | Path | None = None) -> tuple[Any, Any]:
    """A PEFT LoRA adapter merged into its base model (``peft_adapter`` checks it), with the tokenizer:
    (model, tokenizer)."""
    from transformers import AutoTokenizer

    adapter, base = Path(adapter), adapter_base(adapter, base)
    model = peft_adapter(adapter, base).merge_and_unload().eval()
    tokenizer_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    return model, AutoTokenizer.from_pretrained(tokenizer_dir)
