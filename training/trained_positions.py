"""The LM head only where training reads it: the model's own tokens, never the prompt, the ``<information>``
passages or the padding.

A decoder's LM head projects each position onto the whole vocabulary (151,936 tokens for Qwen2.5), and the model's
own turns are a small part of an episode. SFT's loss and GRPO's log-probabilities run the decoder once, then the
LM head on the scored positions only. TRL's fused LM head does this too, but only on a Triton device: on a CPU it
projects every position (``trl.trainer.utils.add_fused_lm_head``). benchmarks/sft_speed.py and
benchmarks/grpo_backends.py measure both.

Nor does the decoder run over padding. TRL pads a step's whole generation batch to its longest prompt and its
longest episode before cutting it into micro-batches, and an agent's episodes differ by whole search rounds of
passages: a one-round episode was trained at the width of the step's longest. Each micro-batch is cut to its
own width first (``trim_padding``); with one episode a micro-batch (``per_device_train_batch_size: 1``, the
generation batch kept by ``gradient_accumulation_steps``) no padding is left at all.
"""

from __future__ import annotations

from typing import Any

import torch

#: config fields that change a model's logits after the LM head; a model with any of them keeps TRL's head
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")  # fmt: skip


def causal_lm(model: Any) -> Any:
    """The causal LM under a PEFT wrapper (its LoRA layers in place), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_lm_head(model: Any) -> bool:
    """Whether ``model``'s logits are its LM head's output as they are (no soft-capping or scaling)."""
    config = causal_lm(model).config.get_text_config()
    return all(getattr(config, name, None) is None for name in _LOGIT_TRANSFORMS)


def scored_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, scored: torch.Tensor):
    """The logits that predict each scored token, one row per ``True`` of ``scored``: the decoder over the
    whole sequence, then the LM head on the hidden states just before the scored positions only.

    ``scored`` is a bool ``(batch, width)`` mask of the last ``width`` positions of ``input_ids`` (a GRPO
    completion; for SFT, the whole sequence less the first token)."""
    causal = causal_lm(model)
    hidden = causal.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    width = scored.size(1)
    before = hidden[:, -width - 1 : -1]  # position t's hidden state predicts token t + 1
    return causal.get_output_embeddings()(before[scored])


def next_token_loss(model: Any, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
    """SFT's cross-entropy over the labelled positions only (``labels`` −100 elsewhere). Equal to the model's own
    loss over full logits (tests/test_sft.py checks it)."""
    targets = inputs["labels"][:, 1:]
    trained = targets != -100
    logits = scored_logits(model, inputs["input_ids"], inputs.get("attention_mask"), trained).float()
    total = torch.nn.functional.cross_entropy(logits, targets[trained], reduction="sum")
    return total / (num_items_in_batch if num_items_in_batch is not None else trained.sum())


def token_logps_and_entropies(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    scored: torch.Tensor,
    temperature: float,
    entropy_grad: bool = False,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GRPO's per-token log-probabilities of the completion (the last ``scored.size(1)`` tokens of ``input_ids``)
    at ``temperature``, and their entropies: ``(batch, width)`` each, computed where ``scored`` is true and 0
    elsewhere. The entropies carry a gradient only with ``entropy_grad`` (an entropy bonus in the loss); TRL
    otherwise only logs them and masks by them; without ``with_entropy`` they are not computed (``None``)."""
    scored = scored.bool()
    targets = input_ids[:, -scored.size(1) :][scored]
    logps = scored_logits(model, input_ids, attention_mask, scored).float().div(temperature).log_softmax(-1)
    token_logps = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    zeros = torch.zeros(scored.shape, dtype=token_logps.dtype, device=token_logps.device)
    # masked_scatter keeps a batch with no scored token connected to the graph: its loss is a differentiable 0
    if not with_entropy:
        return zeros.masked_scatter(scored, token_logps), None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(logps.exp() * logps).sum(-1)
    return zeros.masked_scatter(scored, token_logps), zeros.masked_scatter(scored, entropies)


#: inputs of a vision model's batch, which the loss leaves to TRL (its forward takes them)
_VISION_KEYS = ("pixel_values", "token_type_ids", "mm_token_type_ids")
#: TRL's per-token inputs that span the prompt (left-padded) and those that span the completion (right-padded)
_PROMPT_KEYS = ("prompt_ids", "prompt_mask")
_COMPLETION_KEYS = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                    "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio")  # fmt: skip


def trim_padding(inputs: dict[str, Any]) -> dict[str, Any]:
    """A GRPO micro-batch (TRL's loss inputs) without the columns that are padding in every row: the prompt's
    leading ones and the completion's trailing ones. The loss is unchanged (a padded position is masked out of it,
    and rotary attention sees the same distances); micro-batches with image inputs are returned as they are."""
    if any(key in inputs for key in _VISION_KEYS):
        return inputs
    prompt = inputs["prompt_mask"].bool().any(0)
    completion = inputs["completion_mask"].bool().any(0)
    start = int(prompt.float().argmax()) if prompt.any() else 0  # the first column any prompt reaches
    end = completion.size(0) - int(completion.flip(0).float().argmax()) if completion.any() else 1
    width = inputs["completion_ids"].size(1)
    trimmed = dict(inputs)
    for key in _PROMPT_KEYS:
        trimmed[key] = inputs[key][:, start:]
    for key in _COMPLETION_KEYS:
        value = inputs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.size(1) == width:  # a per-token column
            trimmed[key] = value[:, :end]
    return trimmed


def grpo_trainer_class():
    """``GRPOTrainer`` whose loss reads log-probabilities from :func:`token_logps_and_entropies` on the positions
    TRL's own loss keeps (``completion_mask × tool_mask``: the sampled tokens, not the observations or padding).

    With ``beta`` (a KL term), the reference's log-probabilities are read the same way, per micro-batch in the loss
    and on the same positions, where TRL scores every position of the whole padded generation batch through the
    full vocabulary before the first micro-batch. The KL reads them on those positions only, so it is unchanged;
    in the step before the first update policy and reference are one computation, and the KL is exactly 0.

    TRL's own computation still runs wherever these would not match it: the old policy's log-probs, vision inputs,
    MoE auxiliary losses, ``cast_lm_head_to_fp32``, a model whose logits are scaled or capped, and several
    processes (the decoder is called past DDP's wrapper)."""
    from contextlib import nullcontext

    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    class ScoredPositionsGRPOTrainer(GRPOTrainer):
        _scored: torch.Tensor | None = None

        def _scores_here(self) -> bool:
            return (
                not self.args.cast_lm_head_to_fp32 and self.accelerator.num_processes == 1 and plain_lm_head(self.model)
            )

        def _generate_and_score_completions(self, inputs):
            if self.beta == 0.0 or not self._scores_here():
                return super()._generate_and_score_completions(inputs)
            beta, self.beta = self.beta, 0.0  # TRL's reference pass is skipped: _compute_loss scores it
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self.beta = beta

        def _compute_loss(self, model, inputs):
            inputs = trim_padding(inputs)
            mask = inputs["completion_mask"]
            self._scored = mask * inputs["tool_mask"] if "tool_mask" in inputs else mask
            try:
                if self.beta != 0.0 and "ref_per_token_logps" not in inputs:
                    inputs = inputs | {"ref_per_token_logps": self._reference_logps(model, inputs)}
                return super()._compute_loss(model, inputs)
            finally:
                self._scored = None

        def _reference_logps(self, model, inputs) -> torch.Tensor:
            """The reference's log-probabilities of the micro-batch's sampled tokens (0 elsewhere): ``ref_model``
            where TRL made one, else the PEFT model with the initial adapter's frozen copy ("ref") active, or with
            no adapter when training began from the base."""
            vision = [k for k in _VISION_KEYS if k in inputs]
            if vision:
                raise ValueError(f"--lm_head scored with --beta reads text only; this batch holds {vision}: use "
                                 "--lm_head trl")  # fmt: skip
            if self.ref_model is not None:
                reference, active = self.ref_model, nullcontext()
            else:
                peft = self.accelerator.unwrap_model(self.model)
                reference, active = model, use_adapter(peft, "ref" if "ref" in peft.peft_config else None)
            input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            checkpointing = disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs)
            with torch.no_grad(), checkpointing, active, self.accelerator.autocast():
                logps, _ = token_logps_and_entropies(
                    reference, input_ids, attention_mask, self._scored, self.temperature, with_entropy=False
                )
            return logps

        def _get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
            compute_aux_loss=False, **vision,
        ):  # fmt: skip
            ours = (
                self._scored is not None
                and self._scored.size(1) == logits_to_keep
                and not compute_aux_loss
                and all(value is None for value in vision.values())
                and self._scores_here()
            )
            if not ours:
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                    **vision,
                )  # fmt: skip
            size, scored, chunks = batch_size or input_ids.size(0), self._scored, []
            for start in range(0, input_ids.size(0), size):
                rows = slice(start, start + size)
                with self.accelerator.autocast():
                    chunk = token_logps_and_entropies(
                        model, input_ids[rows], attention_mask[rows], scored[rows], self.temperature,
                        entropy_grad=self._entropy_bonus_enabled,
                    )  # fmt: skip
                chunks.append(chunk)
            logps = torch.cat([c[0] for c in chunks])
            entropies = torch.cat([c[1] for c in chunks]) if compute_entropy else None
            return logps, entropies, None

    return ScoredPositionsGRPOTrainer
