"""Teacher guidance for GRPO (DGPO, arXiv 2508.20324): a rollout whose answer was wrong is pulled toward a
teacher's distribution on the tokens it sampled; a rollout that answered right is left to the reward alone.

DGPO (PPO in verl) subtracts β·KL(student ‖ teacher) from the token rewards of its zero-reward samples. GRPO
has one advantage an episode and no token rewards, so the teacher enters as a loss term, the way TRL's β term
enters for its reference model: the same k3 estimate of the KL on each sampled token (not the observations or
padding), on the episodes whose outcome reward is below 1 (not an exact match), over the step's trained tokens
(``num_items_in_batch``) whatever ``loss_type`` normalises the policy term by.

The teacher is any causal LM over the student's vocabulary: a LoRA adapter on the student's own base (the SFT
policy, loaded merged beside the trained one) or a larger model of its family. It is frozen and scores only the
guided episodes, one forward pass each, no backward.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ps_agent.llms import model_path
from ps_agent.llms.adapters import load_adapter_model
from training.trained_positions import plain_lm_head, token_logps_and_entropies, trim_padding

logger = logging.getLogger(__name__)

#: the per-episode columns a guided step adds to TRL's loss inputs
TEACHER_LOGPS, GUIDED = "teacher_per_token_logps", "teacher_guided"


def load_teacher(teacher: str, student: str | Path) -> Any:
    """The frozen teacher: ``teacher`` a LoRA adapter folder (merged into its base, which must be the student's
    base ``student``) or a model folder or embedded name whose vocabulary is the student's; refused otherwise,
    with both named."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (Path(teacher) / "adapter_config.json").is_file():
        model, _ = load_adapter_model(teacher, student)
    else:
        folder = model_path(teacher)
        if not Path(folder).is_dir():
            raise SystemExit(
                f"--teacher {teacher}: not a model folder, an embedded model's name or a LoRA adapter folder "
                "(expected e.g. policies/qwen0.5b-parallelsearch, or a transformers model folder)"
            )
        theirs = AutoTokenizer.from_pretrained(folder).get_vocab()
        ours = AutoTokenizer.from_pretrained(student).get_vocab()
        if theirs != ours:
            raise SystemExit(
                f"--teacher {teacher}: its vocabulary ({len(theirs)} tokens) is not the student's ({student}, "
                f"{len(ours)} tokens), so it cannot score the student's tokens; expected a model of the student's "
                "family or an adapter on its base"
            )
        model = AutoModelForCausalLM.from_pretrained(folder)
    if not plain_lm_head(model):
        raise SystemExit(f"--teacher {teacher}: its logits are scaled or capped after the LM head; not supported")
    return model.eval().requires_grad_(False)


def teacher_kl(student_logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-token k3 estimate of KL(student ‖ teacher) at tokens the student sampled: ``exp(d) − d − 1``,
    ``d = teacher − student``, non-negative, 0 where they agree, as TRL estimates its β term; 0 where ``mask``
    is 0 (masked before the exponential: an unscored position's gap is not a log-ratio and may overflow)."""
    gap = (teacher_logps - student_logps) * mask
    return torch.exp(gap) - gap - 1


def teacher_guided(trainer_class: type) -> type:
    """``trainer_class`` (a ``GRPOTrainer``) with a frozen ``teacher`` model and ``teacher_coef``: each step,
    the teacher scores the episodes whose outcome reward is below 1, and the loss adds ``teacher_coef`` × their
    KL to it per trained token of the step."""

    class TeacherGuidedGRPOTrainer(trainer_class):
        def __init__(self, *args, teacher: Any, teacher_coef: float, **kwargs):
            super().__init__(*args, **kwargs)
            self.teacher = teacher.to(self.accelerator.device)
            self.teacher_coef = teacher_coef
            if "outcome_reward" not in self.reward_func_names:
                raise ValueError(
                    f"--teacher guides the rollouts whose outcome_reward is below 1, but the reward functions are "
                    f"{self.reward_func_names}; expected ps_agent.rewards.outcome_reward among them"
                )
            self._outcome = self.reward_func_names.index("outcome_reward")
            self._student_logps: torch.Tensor | None = None
            self._capture = False

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            start = self.accelerator.process_index * len(prompts)  # rewards are gathered over processes
            self._outcomes = rewards[start : start + len(prompts), self._outcome]
            return rewards

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            guided = self._outcomes < 1.0  # a NaN (unscorable) outcome is not guided
            output[TEACHER_LOGPS] = self._teacher_logps(output, guided)
            output[GUIDED] = guided.float()
            mode = "train" if self.model.training else "eval"
            share = self.accelerator.gather(guided.float()).mean().item()
            self._metrics[mode]["teacher/guided_frac"].append(share)
            return output

        @torch.no_grad()
        def _teacher_logps(self, output: dict, guided: torch.Tensor) -> torch.Tensor:
            """The teacher's log-probabilities of each guided episode's sampled tokens (0 elsewhere), one episode
            at a time at its own width."""
            logps = torch.zeros_like(output["completion_ids"], dtype=torch.float32)
            keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask")
            for row in guided.nonzero().flatten().tolist():
                episode = trim_padding({k: output[k][row : row + 1] for k in keys if k in output})
                mask = episode["completion_mask"] * episode.get("tool_mask", 1)
                ids = torch.cat([episode["prompt_ids"], episode["completion_ids"]], dim=1)
                attention = torch.cat([episode["prompt_mask"], episode["completion_mask"]], dim=1)
                with self.accelerator.autocast():
                    scored, _ = token_logps_and_entropies(
                        self.teacher, ids, attention, mask, self.temperature, with_entropy=False
                    )
                logps[row, : scored.size(1)] = scored[0]
            return logps

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if self._capture:  # the loss's own call, with its gradient
                self._student_logps = result[0]
            return result

        def _compute_loss(self, model, inputs):
            self._capture = True
            try:
                loss = super()._compute_loss(model, inputs)
                student = self._student_logps
            finally:
                self._capture, self._student_logps = False, None
            if student is None:
                raise RuntimeError("the policy loss computed no log-probabilities through the trainer's hook")
            width = student.size(1)  # the loss may have trimmed trailing padding off the completion
            mask = inputs["completion_mask"][:, :width] * inputs.get("tool_mask", inputs["completion_mask"])[:, :width]
            mask = mask * inputs[GUIDED].unsqueeze(1)
            kl = teacher_kl(student, inputs[TEACHER_LOGPS][:, :width], mask)
            mode = "train" if self.model.training else "eval"
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":  # as TRL normalises dapo: the step's trained tokens, one accumulation window's share
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            guided_tokens = self.accelerator.gather(mask.sum())
            if guided_tokens.sum() > 0:  # per micro-batch; the step logs their mean, as TRL logs its `kl`
                mean = self.accelerator.gather(kl.detach().sum()).sum() / guided_tokens.sum()
                self._metrics[mode]["teacher/kl"].append(mean.item())
            return loss + self.teacher_coef * kl.sum() / normalizer

    return TeacherGuidedGRPOTrainer
