"""The server side of the ``openai`` rollout backend: after each optimizer step, the vLLM server gets the policy
being trained, as a LoRA adapter it loads or as merged weights it reloads."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from ps_agent.llms.vllm_server import load_adapter, reload_weights, unload_adapter

logger = logging.getLogger(__name__)


def save_merged(model: Any, folder: Path) -> None:
    """A model folder of ``model``'s weights, a PEFT model's LoRA adapter merged into its base weights (the
    training model is left as it was)."""
    if not hasattr(model, "merge_adapter"):
        model.save_pretrained(folder)
        return
    with torch.no_grad():
        model.merge_adapter()
        try:
            state = {
                name.replace(".base_layer", ""): tensor.detach().clone()
                for name, tensor in model.get_base_model().state_dict().items()
                if "lora_" not in name
            }
        finally:
            model.unmerge_adapter()
    model.get_base_model().save_pretrained(folder, state_dict=state)


class WeightSync:
    """The server side of the ``openai`` backend: after each optimizer step, the server gets the new policy. It
    saves the LoRA adapter and loads it under a new name, unloading the one before (``lora``), or reloads the
    merged weights (``reload``: the served model keeps its name, ``None`` asks the server for it)."""

    def __init__(self, url: str | None, mode: str, output_dir: Path) -> None:
        self.url, self.mode, self.output_dir = url, mode, output_dir
        self.step: int | None = None
        self.name: str | None = None

    def __call__(self, trainer: Any) -> str | None:
        """The served model's name for the trainer's current step, synced once per step."""
        step = trainer.state.global_step
        if step == self.step:
            return self.name
        model = trainer.accelerator.unwrap_model(trainer.model)
        name = None if self.mode == "reload" else f"policy-step-{step}"
        if trainer.accelerator.is_main_process:
            if self.mode == "reload":
                folder = self.output_dir / "served-policy" / f"step-{step}"
                save_merged(model, folder)
                reload_weights(self.url, folder)
                for old in folder.parent.glob("step-*"):
                    if old != folder:
                        shutil.rmtree(old, ignore_errors=True)
                logger.info("reloaded %s with the policy of step %d", self.url, step)
            else:
                path = (self.output_dir / "adapters" / name).resolve()
                model.save_pretrained(path)
                load_adapter(self.url, name, path)
                logger.info("loaded adapter %s into %s", name, self.url)
                if self.name is not None:
                    unload_adapter(self.url, self.name)
        trainer.accelerator.wait_for_everyone()
        self.step, self.name = step, name
        return name
