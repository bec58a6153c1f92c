"""Every file in training/configs/ loads with the loader that will read it, so none can rot unnoticed."""

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

CONFIGS = Path(__file__).resolve().parents[1] / "training" / "configs"
ALL = sorted(CONFIGS.rglob("*.yaml"))
CPU = ["--use_cpu", "true", "--bf16", "false"]  # GPU recipes parse here with the GPU switches turned off


def test_every_config_is_loaded_by_a_test():
    kinds = {path.relative_to(CONFIGS).parts[0] for path in ALL}
    assert {"accelerate", "paper"} <= kinds and len(ALL) >= 8  # a new folder or file gets a case below


@pytest.mark.parametrize("path", [p for p in ALL if p.parent.name == "accelerate"], ids=lambda p: p.name)
def test_accelerate_configs_load_with_accelerates_own_loader(path):
    config = load_config_from_file(str(path))
    assert config.distributed_type.value in ("DEEPSPEED", "FSDP") and config.mixed_precision == "bf16"
    assert config.num_processes % config.num_machines == 0


@pytest.mark.parametrize(
    "path", [p for p in ALL if p.parent.name != "accelerate" and not p.name.startswith("sft_")], ids=lambda p: p.name
)
def test_grpo_configs_parse_with_trls_parser(path):
    from training.run_grpo import parse

    args, config = parse(["--config", str(path), *CPU])
    assert args.mode in ("parallel", "sequential") and config.num_generations >= 2
    if path.parent.name == "paper":  # the paper's recipe: Search-R1's numbers (docs/scale.md)
        assert (args.max_turns, args.topk, args.max_new_tokens, args.use_lora) == (4, 3, 500, False)
        assert (config.learning_rate, config.beta, config.num_generations) == (1e-6, 0.001, 5)
        assert config.use_vllm and config.vllm_mode == "server" and args.backend == "trl-vllm"
        # one generation of 512 prompts x 5 feeds 2 optimizer steps (6 training processes)
        assert config.steps_per_generation == 2 * config.gradient_accumulation_steps


@pytest.mark.parametrize("path", [p for p in ALL if p.name.startswith("sft_")], ids=lambda p: p.name)
def test_sft_configs_parse_with_trls_parser(path):
    from training.run_sft import parse

    args, config = parse(["--config", str(path)])
    assert Path(args.episodes).suffix == ".jsonl" and config.max_length > 0


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16", "no-bf16"])
@pytest.mark.parametrize("cuda", [True, False], ids=["gpu", "cpu"])
def test_training_scripts_pick_the_gpu_else_bf16_only_where_the_cpu_has_it(monkeypatch, cuda, native):
    import torch

    from training import precision, run_grpo, run_sft

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)  # stand-in answers: no GPU is touched
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    expected = {"use_cpu": not cuda, "bf16": cuda or native}
    assert precision.device_defaults() == expected
    if cuda:  # TrainingArguments would look for the GPU this stand-in promises
        return
    for script in (run_sft, run_grpo):
        config = script.parse([])[1]
        assert (config.use_cpu, config.bf16) == (expected["use_cpu"], expected["bf16"]), script.__name__


def test_training_scripts_parse_to_the_cpu_without_a_gpu_and_flags_override(monkeypatch):
    import torch

    from training.run_grpo import parse

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)  # as on an AVX2 CPU
    config = parse([])[1]
    assert config.use_cpu is True and config.bf16 is False
    assert parse(["--use_cpu", "false", "--bf16", "false"])[1].use_cpu is False
