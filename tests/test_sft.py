"""The SFT warm start: real batches mask the prompt and observations, and run_sft trains, saves and resumes."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from training.gold import build_episodes
from training.plans import synthetic_questions
from training.run_sft import load_examples, main, sft_example

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def episodes_file(smollm2_path, tmp_path_factory):
    """Gold episodes of a small synthetic world, as training/gold.py writes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    out = tmp_path_factory.mktemp("gold")
    gold = synthetic_questions([5], entities=60, per_family=1, out=out)
    episodes, _ = build_episodes(gold.questions, "parallel", tokenizer, topk=2)
    path = out / "parallel.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes[:8]))
    return path, episodes[:8]


def sft_args(model, episodes, out, *extra):
    return [
        "--model_name_or_path", str(model), "--episodes", str(episodes), "--output_dir", str(out),
        "--per_device_train_batch_size", "2", "--save_steps", "1", "--logging_steps", "1", "--report_to", "none",
        "--lora_r", "4", *extra,
    ]  # fmt: skip


def test_a_real_batch_masks_every_prompt_and_observation_token(tiny_model, episodes_file, tmp_path):
    from transformers import TrainerCallback

    path, episodes = episodes_file
    seen = []

    class FirstBatch(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            seen.append(next(iter(train_dataloader)))

    main(sft_args(tiny_model, path, tmp_path / "run", "--max_steps", "1"), callbacks=[FirstBatch()])
    batch = seen[0]
    by_ids = {tuple(e["prompt_ids"] + e["completion_ids"]): e for e in episodes}
    for input_ids, labels, attention in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
        n = int(attention.sum())
        ep = by_ids[tuple(input_ids[:n].tolist())]  # a real episode, right-padded
        trained = [0] * len(ep["prompt_ids"]) + ep["env_mask"]
        for token, label, keep in zip(input_ids[:n].tolist(), labels[:n].tolist(), trained, strict=True):
            assert label == (token if keep else -100)
        assert (labels[n:] == -100).all()  # padding
        assert sum(trained) > 0 and sum(trained) < n  # some tokens are trained, the prompt never


def test_two_sft_steps_with_a_tiny_model_then_resume(tiny_model, episodes_file, tmp_path):
    path, _ = episodes_file
    out = tmp_path / "run"
    final = main(sft_args(tiny_model, path, out, "--max_steps", "2"))
    assert (final / "adapter_model.safetensors").is_file() and (final / "adapter_config.json").is_file()
    assert (out / "checkpoint-2").is_dir()
    main(sft_args(tiny_model, path, out, "--max_steps", "3", "--resume_from_checkpoint", str(out / "checkpoint-2")))
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]

    from safetensors import safe_open

    with safe_open(final / "adapter_model.safetensors", "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}  # noqa: SIM118 (not a dict)


def test_sft_goes_on_from_an_adapter_of_its_base_and_refuses_one_of_another(tiny_model, episodes_file, tmp_path):
    """Issue 25: new gold episodes continue the shipped policy instead of starting a new adapter."""
    from safetensors.torch import load_file

    from ps_agent.llms import LLMSpecError

    path, _ = episodes_file
    steps = ("--max_steps", "1", "--warmup_steps", "0")
    first = main(sft_args(tiny_model, path, tmp_path / "first", *steps))
    second = main(sft_args(tiny_model, path, tmp_path / "second", *steps, "--init_adapter", str(first)))
    before, after = load_file(first / "adapter_model.safetensors"), load_file(second / "adapter_model.safetensors")
    assert before.keys() == after.keys()  # the same LoRA modules, at --init_adapter's rank
    lora_b = [k for k in before if "lora_B" in k]
    assert any(before[k].abs().sum() > 0 for k in lora_b)  # trained once: B is no longer the zero it starts at
    assert any(not (before[k] == after[k]).all() for k in lora_b)  # and trained on from there
    assert json.loads((second / "adapter_config.json").read_text())["r"] == 4
    with pytest.raises(LLMSpecError, match=r"was trained on base model .*tiny.*, but the base model given is .*qwen"):
        main(sft_args("qwen0.5b", path, tmp_path / "other", *steps, "--init_adapter", str(first)))


def test_resume_true_takes_the_newest_whole_checkpoint_and_skips_a_torn_one(
    tiny_model, smollm2_path, episodes_file, tmp_path, caplog
):
    """Issue 27: ``--resume_from_checkpoint True`` never worked for run_sft.py, and a save cut off by a SIGTERM
    (no trainer_state.json yet) stopped the resume until someone deleted it by hand."""
    path, _ = episodes_file
    out = tmp_path / "run"
    main(sft_args(tiny_model, path, out, "--max_steps", "2"))
    torn = out / "checkpoint-3"
    shutil.copytree(out / "checkpoint-2", torn)
    (torn / "trainer_state.json").unlink()
    main(sft_args(tiny_model, path, out, "--max_steps", "3", "--resume_from_checkpoint", "True"))
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]
    assert f"skipping {torn}: {torn} holds no trainer_state.json" in caplog.text
    other_base = rf"adapter of base model '.*{tiny_model.name}', but this run trains '.*{smollm2_path.name}'"
    with pytest.raises(SystemExit, match=other_base):  # PEFT would load it, or fail on shapes, much later
        main(sft_args(smollm2_path, path, out, "--max_steps", "4", "--resume_from_checkpoint", "True"))
    with pytest.raises(SystemExit, match=r"holds no complete checkpoint"):
        main(sft_args(tiny_model, path, tmp_path / "empty", "--max_steps", "3", "--resume_from_checkpoint", "True"))


def test_a_resume_on_other_episodes_or_another_limit_or_seed_is_refused(tiny_model, episodes_file, tmp_path):
    """A run resumed in a later session skips the batches it trained on by position: on a rebuilt episode
    file that differs, it would skip episodes it never saw and train twice on others."""
    path, episodes = episodes_file
    out = tmp_path / "run"
    main(sft_args(tiny_model, path, out, "--max_steps", "1"))
    record = json.loads((out / "checkpoint-1" / "episodes.json").read_text())
    assert record["episodes"] == str(path) and len(record["sha256"]) == 64
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(e) + "\n" for e in reversed(episodes)))
    resume = ("--max_steps", "2", "--resume_from_checkpoint", str(out / "checkpoint-1"))
    with pytest.raises(
        SystemExit,
        match=rf"was trained on {path} \(sha256 {record['sha256']}\), but the episodes given are .*other\.jsonl",
    ):
        main(sft_args(tiny_model, other, out, *resume))
    copy = tmp_path / "copy.jsonl"  # the same bytes rebuilt elsewhere resume
    copy.write_bytes(path.read_bytes())
    for flag, value in (("--limit", "6"), ("--seed", "1")):  # the same file, but other episodes or another order
        with pytest.raises(SystemExit, match=rf"was trained with {flag} (None|0), but this run has {flag} {value}"):
            main(sft_args(tiny_model, copy, out, *resume, flag, value))
    # another step size skips another number of episodes: some never trained (it resumed silently)
    with pytest.raises(SystemExit, match=r"was trained on 2 episodes a step, but this run takes 4 \(--per_device"):
        main(sft_args(tiny_model, copy, out, *resume, "--gradient_accumulation_steps", "2"))
    main(sft_args(tiny_model, copy, out, *resume))
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


def test_bad_episode_files_are_refused_with_what_was_expected(tmp_path, tiny_model):
    with pytest.raises(FileNotFoundError, match=r"episodes file not found: .*expected the jsonl written by"):
        load_examples(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: not a gold episode .*expected a JSON object with prompt_ids"):
        load_examples(bad)
    ragged = tmp_path / "ragged.jsonl"  # issue 27: these failed without a file or line, or inside the trainer
    good = {"prompt_ids": [1, 2], "completion_ids": [3, 4], "env_mask": [1, 1]}
    ragged.write_text(json.dumps(good) + "\n" + json.dumps(good | {"env_mask": [1]}) + "\n")
    with pytest.raises(ValueError, match=r"ragged\.jsonl:2: not a gold episode .*env_mask of the completion's length"):
        load_examples(ragged)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps(good) + "\n" + json.dumps(good | {"completion_ids": [3, 10**6]}) + "\n")
    with pytest.raises(ValueError, match=r"foreign\.jsonl:2: token id 1000000 is not in the model's vocabulary of 500"):
        load_examples(foreign, vocab_size=500)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt_ids": [1] * 50, "completion_ids": [2] * 60, "env_mask": [1] * 60}) + "\n")
    with pytest.raises(ValueError, match="1 episodes are longer than max_length=100"):
        main(sft_args(tiny_model, long, tmp_path / "run", "--max_length", "100", "--max_steps", "1"))


def test_gold_records_its_command_and_tokenizer_and_sft_refuses_another_models_episodes(tiny_model, tmp_path):
    """SmolLM2's ids all fit Qwen's vocabulary: gold built without --model qwen0.5b trained Qwen on the wrong tokens
    and chat template, silently; nothing but a sha256 in a comment said how a gold file was built."""
    from training.gold import main as gold_main

    flags = ["--model", "smollm2", "--seeds", "5", "--entities", "60", "--per-family", "1", "--shared"]
    episodes = gold_main([*flags, "--out", str(tmp_path / "gold" / "parallel.jsonl")])
    summary = json.loads(episodes.with_suffix(".summary.json").read_text())
    assert summary["tokenizer"] == "smollm2-135m-instruct" and summary["command"].startswith("python training/gold.py")
    assert summary["command"].endswith(f"--out {tmp_path / 'gold' / 'parallel.jsonl'}")
    with pytest.raises(ValueError, match=r"holds token ids of smollm2-135m-instruct's tokenizer .*not of tiny"):
        main(sft_args(tiny_model, episodes, tmp_path / "run", "--max_steps", "1"))


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_the_shipped_adapters_configs_parse(mode):
    from training.run_sft import parse

    config = Path(__file__).resolve().parents[1] / "training" / "configs" / f"sft_{mode}.yaml"
    args, sft = parse(["--config", str(config)])
    assert args.episodes == f"runs/gold/{mode}.jsonl" and args.lora_r == 16 and sft.max_length == 896


class AutocastAcceleratorDouble:
    """Test double: an Accelerator's ``autocast()`` for a bf16 run, or for a float32 one (Accelerate's state is one
    per process, so a test cannot build both)."""

    def __init__(self, bf16: bool) -> None:
        self.bf16 = bf16

    def autocast(self):
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-run", "float32-run"])
def test_the_trained_positions_loss_runs_in_the_precision_of_the_run(tiny_model, episodes_file, bf16):
    """The loss calls the decoder past the model's forward, which Accelerate wraps in the run's autocast: a bf16
    run trained it in float32 (half the speed of the full loss on a CPU with native bf16)."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.run_sft import _own_loss_trainer

    _, episodes = episodes_file
    row = sft_example(episodes[0])
    batch = {"input_ids": torch.tensor([row["input_ids"]]), "labels": torch.tensor([row["labels"]])}
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    trainer = type("TrainerDouble", (), {"accelerator": AutocastAcceleratorDouble(bf16)})()
    _own_loss_trainer("trained_positions").compute_loss(trainer, model, batch)
    assert seen == [torch.bfloat16 if bf16 else torch.float32]


def test_the_trained_positions_loss_equals_the_models_own_loss_and_gradient(tiny_model, episodes_file):
    """The LM head on the labelled positions only gives the full-logits cross-entropy and the same gradients,
    on the bare model and through a LoRA wrapper."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.trained_positions import next_token_loss

    _, episodes = episodes_file
    rows = [sft_example(e) for e in episodes[:2]]
    width = max(len(r["input_ids"]) for r in rows)
    batch = {
        "input_ids": torch.tensor([r["input_ids"] + [0] * (width - len(r["input_ids"])) for r in rows]),
        "labels": torch.tensor([r["labels"] + [-100] * (width - len(r["labels"])) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows]),
    }
    torch.manual_seed(0)
    for wrap in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        if wrap:
            model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        full = model(**batch).loss
        (full_grad,) = torch.autograd.grad(full, [p for p in model.parameters() if p.requires_grad][:1])
        ours = next_token_loss(model, batch)
        (our_grad,) = torch.autograd.grad(ours, [p for p in model.parameters() if p.requires_grad][:1])
        assert torch.allclose(ours, full, atol=1e-5), (wrap, ours.item(), full.item())
        assert torch.allclose(our_grad, full_grad, atol=1e-6)
        assert next_token_loss(model, batch, num_items_in_batch=torch.tensor(1)) > ours  # a sum over 1 item


def poison_gradients(steps: set[int]):
    """A test double of a diverging run: a callback that writes NaN into one gradient on the given steps, after
    the backward pass and before the optimizer (run_sft's own callbacks follow the caller's)."""
    import torch
    from transformers import TrainerCallback

    class PoisonGradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 in steps:
                next(p for p in model.parameters() if p.grad is not None).grad[0] = torch.nan

    return PoisonGradients()


def adapter_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def test_a_step_with_nan_gradients_is_skipped_and_the_run_goes_on(tiny_model, episodes_file, tmp_path, caplog):
    import torch

    path, _ = episodes_file
    out = tmp_path / "run"
    args = sft_args(tiny_model, path, out, "--max_steps", "3", "--save_total_limit", "3")
    final = main(args, callbacks=[poison_gradients({2})])
    assert "step 2: gradients are not finite" in caplog.text
    assert all(w.isfinite().all() for w in adapter_weights(final).values())
    one, two, three = (adapter_weights(out / f"checkpoint-{n}") for n in (1, 2, 3))
    assert all(torch.equal(one[k], two[k]) for k in one)  # step 2 changed nothing
    assert not all(torch.equal(two[k], three[k]) for k in two)  # step 3 trained again


def test_nan_gradients_three_steps_in_a_row_stop_the_run_with_finite_checkpoints(tiny_model, episodes_file, tmp_path):
    path, _ = episodes_file
    out = tmp_path / "run"
    with pytest.raises(FloatingPointError, match=r"steps 2-4: 3 steps in a row with non-finite gradients"):
        main(sft_args(tiny_model, path, out, "--max_steps", "6"), callbacks=[poison_gradients({2, 3, 4})])
    assert not (out / "final").exists()
    assert all(w.isfinite().all() for w in adapter_weights(out / "checkpoint-3").values())


def test_an_adapter_holding_nan_is_not_saved(tiny_model, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.run_sft import save_adapter

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=4, target_modules=["q_proj"]))
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n)[0, 0] = torch.nan
    with pytest.raises(FloatingPointError, match=r"1 of its 4 tensors hold NaN or inf \(first: .*lora_B"):
        save_adapter(model, tmp_path / "final", torch.bfloat16, "tiny")
    assert not (tmp_path / "final").exists()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--packing", "true"], "--packing / --padding_free"),
        (["--loss_type", "dft"], "--loss_type dft"),
        (["--loss", "full", "--padding_free", "true"], "--packing / --padding_free"),
        (["--label_smoothing_factor", "0.1"], "--label_smoothing_factor"),
    ],
)
def test_what_our_loss_would_ignore_is_refused_before_anything_loads(tmp_path, flags, named):
    """Our losses take one unpacked episode a row in TRL's cross-entropy: with packing they ran the decoder
    without the packed rows' position ids (episodes attended to each other), and --loss_type dft was ignored."""
    missing = tmp_path / "no-model"  # refused before the model or the episodes are read
    with pytest.raises(ValueError, match=rf"would ignore {re.escape(named)}: pass --loss trl"):
        main(sft_args(missing, tmp_path / "no-episodes.jsonl", tmp_path / "run", *flags))


def test_a_run_resumed_in_its_second_epoch_trains_the_uninterrupted_runs_episodes_in_its_order(
    tiny_model, episodes_file, tmp_path, monkeypatch
):
    """group_by_length's sampler drew each epoch's order from the global RNG: resumed in epoch 2, a run trained that
    epoch in epoch 1's order and skipped by position, some episodes twice and others never (as GRPO's did)."""
    import shutil

    import training.run_sft as run_sft

    path, episodes = episodes_file
    by_tokens = {tuple(e["prompt_ids"] + e["completion_ids"]): i for i, e in enumerate(episodes)}
    seen = []
    real = run_sft.next_token_loss

    def spy(model, inputs, n=None):  # which episode each step trains (batches of one)
        seen.append(by_tokens[tuple(inputs["input_ids"][0].tolist())])
        return real(model, inputs, n)

    monkeypatch.setattr(run_sft, "next_token_loss", spy)
    two_epochs = ["--per_device_train_batch_size", "1", "--num_train_epochs", "2", "--save_total_limit", "50"]
    main(sft_args(tiny_model, path, tmp_path / "whole", *two_epochs))
    whole, epoch = list(seen), len(seen) // 2
    assert sorted(whole[:epoch]) == sorted(whole[epoch:]) and whole[:epoch] != whole[epoch:]  # two shuffles
    resumed = tmp_path / "resumed"
    resumed.mkdir()  # a later session goes on from three steps into the second epoch
    shutil.copytree(tmp_path / "whole" / f"checkpoint-{epoch + 3}", resumed / f"checkpoint-{epoch + 3}")
    seen.clear()
    main(sft_args(tiny_model, path, resumed, *two_epochs, "--resume_from_checkpoint", "True"))
    assert seen == whole[epoch + 3 :]


@pytest.mark.slow
def test_a_run_on_two_processes_resumed_in_its_second_epoch_ends_with_the_uninterrupted_runs_weights(
    tiny_model, episodes_file, tmp_path, two_ranks
):
    """On two processes the default loss (trained positions) called the decoder past DDP's wrapper and failed; and
    a run resumed in its second epoch trained it in epoch 0's order (accelerate's ``SkipBatchSampler`` hid the
    sampler from the Trainer's ``set_epoch``), so its weights were not the uninterrupted run's."""
    import subprocess

    import torch
    from safetensors.torch import load_file

    root = Path(__file__).resolve().parents[1]
    path, episodes = episodes_file
    flags = ["--per_device_train_batch_size", "1", "--num_train_epochs", "2", "--save_total_limit", "20",
             "--save_dtype", "float32", "--learning_rate", "1e-2"]  # fmt: skip

    def run(out: Path, *extra: str) -> dict[str, torch.Tensor]:
        command = two_ranks(str(root / "training" / "run_sft.py"), *sft_args(tiny_model, path, out, *flags, *extra))
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        return load_file(out / "final" / "adapter_model.safetensors")

    whole = run(tmp_path / "whole")
    cut = f"checkpoint-{math.ceil(len(episodes) / 2) + 1}"  # an episode a rank a step: one step into the 2nd epoch
    resumed = tmp_path / "resumed"
    resumed.mkdir()  # a later session goes on from there
    shutil.copytree(tmp_path / "whole" / cut, resumed / cut)
    again = run(resumed, "--resume_from_checkpoint", "True")
    assert whole.keys() == again.keys() and all(torch.equal(whole[k], again[k]) for k in whole)
