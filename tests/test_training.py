"""Training: data rows, token-exact rollouts of the real agent, trajectory logs, and real GRPO runs via TRL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from ps_agent.trajectories import TrajectoryLog, read_trajectories, summarise
from tests.doubles import SleepyRetriever
from training.data import DataError, load_questions, read_jsonl, to_row
from training.rollout import AgentRollout, RolloutSettings, token_sequences

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# --- data ---------------------------------------------------------------------------------------


def test_rows_are_validated_and_named(tmp_path):
    assert to_row({"question": " Q? ", "golden_answers": "A", "type": "comparison"}, "x") == {
        "prompt": "Q?",
        "golden_answers": ["A"],
        "question_type": "comparison",
        "id": "x",
    }
    with pytest.raises(DataError, match=r"row 7: missing or empty 'golden_answers'"):
        to_row({"question": "Q?", "golden_answers": []}, "row 7")
    with pytest.raises(DataError, match=r"unknown question type 'comparision'"):
        to_row({"question": "Q?", "golden_answers": ["A"], "type": "comparision"}, "row 8")
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "Q?", "golden_answers": ["A"]}\n{"question": "", "golden_answers": ["A"]}\n')
    with pytest.raises(DataError, match=r"q\.jsonl:2: missing or empty 'question'"):
        read_jsonl(path)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=r"q\.jsonl:1: not JSON"):
        read_jsonl(path)


def test_builtin_and_hf_dataset_sources():
    import datasets

    rows = load_questions("builtin")
    assert {r["question_type"] for r in rows} == {"comparison", "bridge", None}
    ds = datasets.Dataset.from_list([{"question": "Q?", "golden_answers": ["A"], "type": None}])
    assert load_questions(ds)[0]["prompt"] == "Q?"


@pytest.mark.skipif(not (SHARED / "hotpotqa" / "dev.jsonl").is_file(), reason="../shared/data/hotpotqa is absent")
def test_shared_hotpotqa_rows():
    rows = load_questions(SHARED / "hotpotqa" / "dev.jsonl")
    assert len(rows) == 660 and {r["question_type"] for r in rows} == {"bridge", "comparison"}


# --- trajectory log -----------------------------------------------------------------------------


def test_trajectory_log_survives_a_torn_line(tmp_path):
    log = TrajectoryLog(tmp_path / "trajectories-0.jsonl")
    record = {
        "step": 0,
        "question_class": "parallelisable",
        "decomposed": True,
        "format_valid": True,
        "rewards": dict.fromkeys(("outcome", "decomposition", "search_count", "format", "total"), 0.5),
        "stats": {"forced_answer": False, "search_rounds": 1},
    }
    log.append(record)
    with (tmp_path / "trajectories-0.jsonl").open("a") as f:
        f.write('{"step": 1, "quest')  # a crash mid-write
    assert read_trajectories(tmp_path) == [record]
    with (tmp_path / "trajectories-0.jsonl").open("ab") as f:
        f.write('\n{"step": 1, "question": "Zü'.encode()[:-1] + b"\n")  # torn inside a 2-byte character
    log.append(record)
    assert read_trajectories(tmp_path) == [record, record]
    assert summarise([record])["decomposed_by_class"] == {"parallelisable": 1.0}


# --- rollouts -----------------------------------------------------------------------------------


class AcceleratorDouble:
    """Test double: a single-process accelerator."""

    process_index = 0
    is_main_process = True

    @staticmethod
    def unwrap_model(model):
        return model

    @staticmethod
    def wait_for_everyone():
        pass


def trainer_double(model, tokenizer):
    """Test double: what ``AgentRollout`` reads of a GRPOTrainer."""
    return SimpleNamespace(
        model=model, processing_class=tokenizer, accelerator=AcceleratorDouble(), state=SimpleNamespace(global_step=0)
    )


@pytest.fixture(scope="module")
def smollm2_model(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_path), AutoTokenizer.from_pretrained(smollm2_path)


@pytest.mark.slow
def test_real_rollout_is_token_exact_and_masked(smollm2_model, tmp_path):
    model, tokenizer = smollm2_model
    rows = load_questions("builtin")[:2]
    rollout = AgentRollout(
        RolloutSettings(max_turns=2, max_new_tokens=48, demonstration=True, temperature=0.7), rows, tmp_path
    )
    prompts = [rows[0]["prompt"]] * 2 + [rows[1]["prompt"]] * 2
    model.train()
    batch = rollout(prompts, trainer_double(model, tokenizer))
    assert model.training  # generation ran in eval mode, then training mode was restored
    assert rollout.generation_batches[0] == 4  # the first turn of all four rollouts is one batch
    records = read_trajectories(tmp_path)
    assert len(records) == 4 and [r["question"] for r in records] == prompts
    for i in range(4):
        ids, mask, logprobs = batch["completion_ids"][i], batch["env_mask"][i], batch["logprobs"][i]
        assert len(ids) == len(mask) == len(logprobs)
        generated = [t for t, m in zip(ids, mask, strict=True) if m == 1]
        turns = records[i]["turns"]
        assert len(generated) == sum(t["completion_tokens"] for t in turns)
        # the generated tokens decode to the logged completions, turn by turn
        start = 0
        for turn in turns:
            chunk = generated[start : start + turn["completion_tokens"]]
            assert tokenizer.decode(chunk, skip_special_tokens=True) == turn["completion"]
            start += turn["completion_tokens"]
        # observation tokens are masked and are exactly the tokenised observations
        observed = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        assert observed.count("<information>") == len(records[i]["search_rounds"])
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
        assert all(lp <= 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 1)
        assert set(batch["reward_components"][i]) == {"outcome", "decomposition", "search_count", "format", "total"}


@pytest.mark.slow
def test_retriever_failure_is_counted_and_training_goes_on(smollm2_model, tmp_path):
    model, tokenizer = smollm2_model
    rows = [
        {
            "prompt": "Which is older, the Colosseum or the Taj Mahal?",
            "golden_answers": ["Colosseum"],
            "question_type": "comparison",
            "id": "x",
        }
    ]
    retriever = SleepyRetriever(fail_times=10**6, error=ConnectionError("index offline"))
    rollout = AgentRollout(
        RolloutSettings(max_turns=2, max_new_tokens=48, demonstration=True, temperature=0.0, retriever=retriever),
        rows,
        tmp_path,
    )
    batch = rollout([rows[0]["prompt"]], trainer_double(model, tokenizer))
    info = batch["rollout"][0]
    (record,) = read_trajectories(tmp_path)
    assert info["failed_searches"] == sum(
        r["error"] is not None for rnd in record["search_rounds"] for r in rnd["results"]
    )
    if record["search_rounds"]:  # greedy SmolLM2 with the demonstration searches here
        assert info["failed_searches"] > 0


def test_token_sequences_of_a_hand_made_trajectory(smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model_ids = tokenizer("<think> x </think><search> a </search>", add_special_tokens=False).input_ids
    trajectory = {
        "prompt_messages": [{"role": "user", "content": "Q?"}],
        "transcript": [
            {"role": "model", "text": "<think> x </think><search> a </search>", "token_ids": model_ids},
            {"role": "env", "text": "\n\n<information>Doc 1(Title: A) a</information>\n\n", "token_ids": None},
        ],
        "llm_calls": [{"logprobs": [-0.5] * len(model_ids)}],
    }
    seq = token_sequences(trajectory, tokenizer)
    env_ids = tokenizer(trajectory["transcript"][1]["text"], add_special_tokens=False).input_ids
    assert seq["completion_ids"] == model_ids + env_ids
    assert seq["env_mask"] == [1] * len(model_ids) + [0] * len(env_ids)
    assert seq["logprobs"] == [-0.5] * len(model_ids) + [0.0] * len(env_ids)
    assert tokenizer.decode(seq["prompt_ids"]).rstrip().endswith("assistant")


def test_a_finished_episode_ends_with_eos_and_a_long_one_is_cut_and_marked(smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    answer_ids = tokenizer("<think> x </think><answer> Paris </answer>", add_special_tokens=False).input_ids
    trajectory = {
        "answer": "Paris",
        "prompt_messages": [{"role": "user", "content": "Q?"}],
        "transcript": [
            {"role": "model", "text": "<think> x </think><answer> Paris </answer>", "token_ids": answer_ids}
        ],
        "llm_calls": [{"logprobs": [-0.1] * len(answer_ids)}],
    }
    seq = token_sequences(trajectory, tokenizer)
    # TRL counts a completion as finished when it holds EOS: the environment closes the episode (mask 0)
    assert seq["completion_ids"] == [*answer_ids, tokenizer.eos_token_id]
    assert seq["env_mask"] == [1] * len(answer_ids) + [0] and seq["truncated"] is False
    cut = token_sequences(trajectory, tokenizer, max_completion_length=5)
    assert cut["completion_ids"] == answer_ids[:5] and len(cut["env_mask"]) == len(cut["logprobs"]) == 5
    assert cut["truncated"] is True and tokenizer.eos_token_id not in cut["completion_ids"]


# --- GRPO runs ----------------------------------------------------------------------------------


def grpo_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path",
        str(model),
        "--output_dir",
        str(out),
        "--data",
        "builtin",
        "--limit",
        "4",
        "--num_generations",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--max_turns",
        "1",
        "--max_new_tokens",
        "8",
        "--topk",
        "1",
        "--report_to",
        "tensorboard",
        "--save_steps",
        "1",
        *extra,
    ]


def test_two_grpo_steps_with_a_tiny_model_then_resume(tiny_model, tmp_path):
    from training.run_grpo import main

    out = tmp_path / "run"
    TrajectoryLog(out / "trajectories-0.jsonl").append({"step": 0, "killed": "before its first checkpoint"})
    final = main(grpo_args(tiny_model, out, "--max_steps", "2"))  # a fresh run: the earlier log is kept aside
    assert read_trajectories(out / "previous-1") == [{"step": 0, "killed": "before its first checkpoint"}]
    assert (final / "adapter_model.safetensors").is_file()
    assert (out / "checkpoint-2").is_dir()
    assert list((out / "runs").rglob("events.out.tfevents.*"))
    records = read_trajectories(out)
    assert len(records) == 4 and {r["step"] for r in records} == {0, 1}
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    logged = {k for entry in state["log_history"] for k in entry}
    assert {"rewards/outcome_reward/mean", "reward_std", "entropy", "rollout/forced_answer_frac"} <= logged

    # resumed from step 1, the run redoes steps 1 and 2: each step's rollouts are in the log once, none lost
    main(grpo_args(tiny_model, out, "--max_steps", "3", "--resume_from_checkpoint", str(out / "checkpoint-1")))
    records = read_trajectories(out)
    assert sorted(r["step"] for r in records) == [0, 0, 1, 1, 2, 2]


@pytest.mark.slow
def test_one_real_grpo_step_with_smollm2(smollm2_path, tmp_path):
    from training.run_grpo import main

    out = tmp_path / "run"
    main(
        [
            "--output_dir",
            str(out),
            "--max_steps",
            "1",
            "--limit",
            "2",
            "--num_generations",
            "2",
            "--per_device_train_batch_size",
            "2",
            "--max_new_tokens",
            "32",
            "--max_turns",
            "1",
        ]
    )
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert len(read_trajectories(out)) == 2


@pytest.mark.slow
def test_two_process_accelerate_step(tiny_model, tmp_path):
    # `accelerate launch --num_processes 2 --cpu` starts a single process with accelerate 1.15 (its multi-CPU
    # launch needs mpirun); torchrun starts two, which accelerate runs as MULTI_CPU over gloo.
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    out = tmp_path / "run"
    command = [
        torchrun,
        "--nproc_per_node",
        "2",
        str(ROOT / "training" / "run_grpo.py"),
        *grpo_args(tiny_model, out, "--max_steps", "1"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in out.glob("trajectories-*.jsonl")} == {"trajectories-0.jsonl", "trajectories-1.jsonl"}
    assert (out / "final" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_openai_backend_hot_loads_the_adapter_into_vllm(vllm_server, smollm2_path, tmp_path):
    from training.run_grpo import main

    out = tmp_path / "run"
    main(
        [
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--limit",
            "1",
            "--num_generations",
            "2",
            "--per_device_train_batch_size",
            "2",
            "--max_new_tokens",
            "32",
            "--max_turns",
            "1",
            "--backend",
            "openai",
            "--openai_base_url",
            vllm_server,
            "--lora_r",
            "16",
        ]
    )
    served = {m["id"] for m in httpx.get(f"{vllm_server}/models").json()["data"]}
    assert {"policy-step-0", "policy-step-1"} <= served  # loaded after each optimizer step
    assert (out / "adapters" / "policy-step-1" / "adapter_model.safetensors").is_file()
    records = read_trajectories(out)
    assert len(records) == 4 and all(r["turns"] for r in records)


def test_resume_true_means_the_newest_checkpoint_and_its_later_rollouts_are_dropped(tmp_path):
    from training.run_grpo import prepare_trajectory_logs

    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    log = TrajectoryLog(tmp_path / "trajectories-0.jsonl")
    for step in (0, 1, 2, 3):
        log.append({"step": step})
    assert prepare_trajectory_logs(str(tmp_path), "True") == str(tmp_path / "checkpoint-2")
    assert read_trajectories(tmp_path) == [{"step": 0}, {"step": 1}]
    with pytest.raises(SystemExit, match=r"holds no trainer_state\.json"):
        prepare_trajectory_logs(str(tmp_path), str(tmp_path / "checkpoint-9"))
