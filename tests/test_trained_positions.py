"""GRPO's log-probabilities through the LM head on the sampled tokens only: equal to TRL's fused head where the
loss reads them, and in a real GRPO step through TRL the head projects exactly those tokens; and the decoder
runs over each micro-batch at its own width, not the step's longest episode."""

from __future__ import annotations

import json
import os

import pytest
import torch

from training.trained_positions import token_logps_and_entropies, trim_padding

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def lora_model(path, temperature: float):
    """The tiny model with TRL's fused LM head added (as GRPOTrainer adds it) under a LoRA adapter whose weights
    are not zero, so its gradients are compared too."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def test_log_probs_entropies_and_gradients_equal_trls_fused_head_where_scored_and_zero_elsewhere(tiny_model):
    temperature = 0.7
    model = lora_model(tiny_model, temperature)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(5, 1000, (2, 6), generator=generator)
    completion = torch.randint(5, 1000, (2, 9), generator=generator)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # the first prompt left-padded
    completion_mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])  # the second completion right-padded
    tool_mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 1, 1, 1, 1]])  # observations: 0
    scored = completion_mask * tool_mask
    input_ids = torch.cat([prompt, completion], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)

    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, : prompt.size(1)] = -100
    trl = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
    trl_logps, trl_entropy = trl.log_probs[:, -9:], trl.entropy[:, -9:]
    logps, entropies = token_logps_and_entropies(model, input_ids, attention_mask, scored, temperature)

    where = scored.bool()
    assert torch.allclose(logps[where], trl_logps[where], atol=1e-5)
    assert torch.allclose(entropies[where], trl_entropy[where], atol=1e-5)
    assert not logps[~where].any() and not entropies[~where].any()
    assert not entropies.requires_grad  # logged only, unless an entropy bonus needs its gradient

    lora = [p for p in model.parameters() if p.requires_grad]
    ours = torch.autograd.grad(-(logps * scored).sum(), lora)
    theirs = torch.autograd.grad(-(trl_logps * scored).sum(), lora)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-5)

    _, with_grad = token_logps_and_entropies(model, input_ids, attention_mask, scored, temperature, entropy_grad=True)
    assert with_grad.requires_grad and torch.allclose(with_grad, entropies)


EVEREST = {"question": "Which is taller, Mount Everest or K2?", "golden_answers": ["Mount Everest"],
           "type": "comparison"}  # fmt: skip


def grpo_step_watched(tmp_path, monkeypatch, model, questions, flags, on_loss):
    """One real step of run_grpo.main on ``questions`` with ``model``, into ``tmp_path/run`` (its saved adapter's
    folder is returned); ``on_loss(model, inputs)`` sees each loss micro-batch as TRL hands it, and the hook it
    returns is removed once that micro-batch's loss is computed."""
    from trl import GRPOTrainer

    from training.run_grpo import main

    compute_loss = GRPOTrainer.compute_loss

    def watched_compute_loss(self, model, inputs, *args, **kwargs):
        hook = on_loss(model, inputs)
        try:
            return compute_loss(self, model, inputs, *args, **kwargs)
        finally:
            hook.remove()

    monkeypatch.setattr(GRPOTrainer, "compute_loss", watched_compute_loss)
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return main(["--model_name_or_path", str(model), "--output_dir", str(tmp_path / "run"), "--data", str(data),
          "--max_steps", "1", "--max_turns", "2", "--max_new_tokens", "12", "--topk", "1", "--report_to", "none",
          *flags])  # fmt: skip


@pytest.mark.parametrize("lm_head", ["scored", "trl"])
def test_a_real_grpo_step_projects_exactly_the_sampled_tokens_through_the_lm_head(
    tiny_model, tmp_path, monkeypatch, lm_head
):
    """run_grpo.main on the tiny model: in the loss, the LM head module sees one row per token the model sampled
    (completion_mask × tool_mask: not the prompt, the observations or the padding); TRL's fused head reads the
    head's weight directly and projects every position, so with ``--lm_head trl`` the module sees none."""
    projected, sampled, observed = [], [], []

    def count(model, inputs):
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        sampled.append(int(mask.sum()))
        observed.append(int((inputs["completion_mask"] * (1 - inputs["tool_mask"])).sum()))
        head = model.get_output_embeddings()
        return head.register_forward_hook(lambda module, args, out: projected.append(args[0].shape[0]))

    flags = ["--num_generations", "2", "--per_device_train_batch_size", "2", "--lm_head", lm_head]
    grpo_step_watched(tmp_path, monkeypatch, tiny_model, [EVEREST], flags, count)
    assert sampled and sum(observed) > 0, "no observation in the rollouts: the tool mask would go untested"
    assert sum(projected) == (sum(sampled) if lm_head == "scored" else 0)


def test_trim_padding_drops_the_columns_that_are_padding_in_every_row_and_leaves_the_log_probs_as_they_were(
    tiny_model,
):
    """A micro-batch cut from a wider generation batch: two prompts left-padded to a longer one's width, two
    completions right-padded to a longer one's. Trimmed, each per-token input loses exactly those columns, the
    per-episode ones are kept, and the scored log-probabilities are the untrimmed ones."""
    model = lora_model(tiny_model, 1.0)
    generator = torch.Generator().manual_seed(2)
    prompt_mask = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])  # 2 columns no row reaches
    completion_mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]])  # 3 such columns
    inputs = {
        "prompt_ids": torch.randint(5, 1000, (2, 6), generator=generator) * prompt_mask,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(5, 1000, (2, 7), generator=generator) * completion_mask,
        "completion_mask": completion_mask,
        "tool_mask": torch.tensor([[1, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]),
        "old_per_token_logps": torch.randn(2, 7, generator=generator),
        "advantages": torch.tensor([0.5, -0.5]),
        "num_items_in_batch": torch.tensor(6.0),
    }
    trimmed = trim_padding(inputs)

    assert trimmed["prompt_ids"].shape == trimmed["prompt_mask"].shape == (2, 4)
    assert all(trimmed[k].shape == (2, 4) for k in ("completion_ids", "completion_mask", "tool_mask",
                                                    "old_per_token_logps"))  # fmt: skip
    assert torch.equal(trimmed["prompt_ids"], inputs["prompt_ids"][:, 2:])
    assert torch.equal(trimmed["old_per_token_logps"], inputs["old_per_token_logps"][:, :4])
    assert all(trimmed[k] is inputs[k] for k in ("advantages", "num_items_in_batch"))  # one value an episode or step

    def scored_logps(batch):
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        scored = batch["completion_mask"] * batch["tool_mask"]
        logps, _ = token_logps_and_entropies(model, ids, attention, scored, 1.0)
        return logps[scored.bool()]

    assert torch.allclose(scored_logps(trimmed), scored_logps(inputs), atol=1e-5)


def test_a_real_grpo_step_runs_the_decoder_over_each_episode_at_its_own_length(tiny_model, tmp_path, monkeypatch):
    """run_grpo.main with one episode a micro-batch, on two questions of different lengths: TRL pads the step's
    four episodes to its longest prompt and episode, and the decoder sees each at its own length."""
    seen, own, padded = [], [], []

    def measure(model, inputs):
        own.append(int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()))
        padded.append(inputs["prompt_mask"].size(1) + inputs["completion_mask"].size(1))
        embed = model.get_input_embeddings()
        return embed.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))

    longer = EVEREST | {"question": "Of the two mountains named Mount Everest, on the border of Nepal and China, "
                        "and K2, on the border of Pakistan and China, which one is the taller?"}  # fmt: skip
    flags = ["--num_generations", "2", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "4"]
    grpo_step_watched(tmp_path, monkeypatch, tiny_model, [EVEREST, longer], flags, measure)
    assert len(own) == 4 and len(set(own)) > 1, f"episodes of {own} tokens: the trimming goes untested"
    assert seen == own
    assert min(padded) == max(padded) > min(own)  # TRL handed each episode at the step's widest


@pytest.mark.parametrize("lm_head", ["scored", "trl"])
def test_a_real_grpo_step_with_a_kl_term_scores_the_reference_on_the_sampled_tokens_in_the_loss(
    tiny_model, tmp_path, monkeypatch, lm_head
):
    """run_grpo.main with ``--beta`` from an initial adapter that is not zero: with ``--lm_head scored`` TRL's
    reference pass over the whole padded generation batch never runs; the loss projects the sampled tokens twice
    (policy, then reference: the frozen copy of the initial adapter, so before the first update the KL is 0).
    ``--lm_head trl`` runs TRL's pass, which the test sees."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    torch.manual_seed(0)
    adapter = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"),
    )
    adapter.save_pretrained(tmp_path / "init")
    trl_passes, projected, sampled = [], [], []
    trls = GRPOTrainer._get_per_token_logps_and_entropies

    def counted(self, model, input_ids, *args, **kwargs):
        trl_passes.append(input_ids.shape)
        return trls(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counted)

    def count(model, inputs):
        sampled.append(int((inputs["completion_mask"] * inputs["tool_mask"]).sum()))
        head = model.get_output_embeddings()
        return head.register_forward_hook(lambda module, args, out: projected.append(args[0].shape[0]))

    flags = ["--num_generations", "2", "--per_device_train_batch_size", "2", "--lm_head", lm_head,
             "--init_adapter", str(tmp_path / "init"), "--beta", "0.1", "--save_steps", "1"]  # fmt: skip
    grpo_step_watched(tmp_path, monkeypatch, tiny_model, [EVEREST], flags, count)
    logged = json.loads((tmp_path / "run" / "checkpoint-1" / "trainer_state.json").read_text())["log_history"][0]
    if lm_head == "scored":
        assert trl_passes == [] and sum(projected) == 2 * sum(sampled) > 0
        assert logged["kl"] == pytest.approx(0.0, abs=1e-7)
    else:
        assert len(trl_passes) >= 2  # the reference's pass before the loss, and the policy's in it
        assert sum(projected) == 0
