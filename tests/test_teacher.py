"""Teacher guidance (DGPO) in a real GRPO step: the episodes whose answer was wrong are scored by the teacher, and
the step pulls the student toward it on them; a teacher that cannot score the student's tokens is refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.test_trained_positions import EVEREST, grpo_step_watched
from training.teacher import GUIDED, TEACHER_LOGPS, load_teacher, teacher_kl


def save_teacher(base, folder):
    """A LoRA adapter on ``base`` whose weights are not zero: a teacher that differs from the untrained student."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(folder)
    return folder


def sampled_logps(model, inputs) -> torch.Tensor:
    """``model``'s log-probabilities of each completion token from its full logits (no scored-position path)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1]
    return logits.float().log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def test_a_real_grpo_step_scores_the_wrong_episodes_with_the_teacher_and_moves_the_student_toward_it(
    tiny_model, tmp_path, monkeypatch
):
    """run_grpo.main with ``--teacher`` on the tiny model, whose answers are all wrong: every episode is guided,
    the teacher's log-probabilities in the loss inputs are its own on the sampled tokens, the logged KL is the
    student's before the step, and the step (whose advantages are all 0: equal rewards) brings the student closer
    to the teacher on those episodes."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ps_agent.llms.adapters import load_adapter_model

    teacher_dir = save_teacher(tiny_model, tmp_path / "teacher")
    batches = []

    def keep(model, inputs):
        batches.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return model.register_forward_hook(lambda *args: None)

    # float32 on every CPU: under bf16 autocast (where the CPU has it) the scores differ from the float32 ones
    # below by about 1e-3, which is precision, not guidance
    flags = ["--num_generations", "2", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2",
             "--teacher", str(teacher_dir), "--teacher_coef", "100", "--learning_rate", "5e-3",
             "--bf16", "false"]  # fmt: skip
    final = grpo_step_watched(tmp_path, monkeypatch, tiny_model, [EVEREST], flags, keep)

    teacher, _ = load_adapter_model(teacher_dir, tiny_model)
    before = AutoModelForCausalLM.from_pretrained(tiny_model)  # a new LoRA adapter starts as its base
    after = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), final)
    kl_before, kl_after, per_batch = 0.0, 0.0, []
    assert len(batches) == 2  # two micro-batches of one episode, accumulated
    for inputs in batches:
        assert inputs[GUIDED].tolist() == [1.0], "an episode answered right: the guidance goes untested"
        assert not inputs["advantages"].any(), "the rewards differ: the policy term would move the student too"
        mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        theirs = sampled_logps(teacher, inputs)
        assert torch.allclose(inputs[TEACHER_LOGPS][mask], theirs[mask], atol=1e-4)
        assert not inputs[TEACHER_LOGPS][~mask].any()  # the observations and padding are not scored
        kl = teacher_kl(sampled_logps(before, inputs), theirs, mask)
        kl_before, per_batch = kl_before + float(kl.sum()), [*per_batch, float(kl.sum() / mask.sum())]
        kl_after += float(teacher_kl(sampled_logps(after, inputs), theirs, mask).sum())

    state = json.loads((tmp_path / "run" / "checkpoint-1" / "trainer_state.json").read_text())
    logged = state["log_history"][0]
    assert logged["teacher/guided_frac"] == 1.0
    assert logged["teacher/kl"] == pytest.approx(sum(per_batch) / 2, rel=1e-3)  # the micro-batches' mean
    # one Adam step of a fixed size: over 20 runs (the sampled episodes differ) it left 0.11-0.58 of the KL, and 1.0
    # with --teacher_coef 0; a bound of 0.5 failed about one run in eight
    assert kl_after < 0.8 * kl_before


def test_a_teacher_that_cannot_score_the_students_tokens_is_refused_with_both_named(tiny_model, smollm2_path, tmp_path):
    """A model of another vocabulary, and an adapter trained on another base, are refused before training."""
    from transformers import AutoTokenizer

    from ps_agent.llms import LLMSpecError

    other = tmp_path / "other-vocabulary"
    shutil.copytree(tiny_model, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<not-in-the-student>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(SystemExit, match=rf"--teacher {other}: its vocabulary .* is not the student's \({tiny_model}"):
        load_teacher(str(other), tiny_model)

    adapter = save_teacher(tiny_model, tmp_path / "adapter-of-the-tiny-model")
    refused = rf"trained on base model .*{tiny_model.name}.* given is .*{smollm2_path.name}"
    with pytest.raises(LLMSpecError, match=refused):
        load_teacher(str(adapter), smollm2_path)
    with pytest.raises(SystemExit, match="not a model folder"):
        load_teacher(str(tmp_path / "missing"), tiny_model)


def test_a_negative_teacher_coefficient_is_refused_before_anything_loads(tmp_path):
    from training.run_grpo import main

    with pytest.raises(SystemExit, match=r"--teacher_coef -1\.0: expected 0 or more"):
        main(["--teacher", "policies/qwen0.5b-parallelsearch", "--teacher_coef", "-1", "--output_dir", str(tmp_path)])
