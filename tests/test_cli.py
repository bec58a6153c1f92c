"""The ``ps-agent`` command line, run as a real subprocess."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ps_agent.metrics import exact_match

ROOT = Path(__file__).resolve().parents[1]
PS_AGENT = shutil.which("ps-agent", path=str(Path(sys.executable).parent)) or "ps-agent"


def run(*args: str) -> subprocess.CompletedProcess:
    # A guard against a hang, not a speed bound: the default policy's two turns on a 2-core CPU that is also
    # training took over 300 s.
    return subprocess.run([PS_AGENT, *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_make_demo_is_answered_right_by_the_embedded_defaults(qwen_path):
    """The README's first screen: `make demo` asks its question through `ps-agent ask`, and the default policy
    searches both rivers in one parallel round and answers right. An adapter that does not must change the demo,
    and the README with it."""
    question = re.search(r"^QUESTION \?= (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    result = run("ask", question, "--json")
    assert result.returncode == 0, result.stderr
    # a first run's screen: no Hub lookup warning (offline), no deprecation warning, no weights bar
    assert "Warning" not in result.stderr and "Loading weights" not in result.stderr, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"answer", "trajectory", "stats"}
    assert out["stats"]["llm_calls"] == len(out["trajectory"]["llm_calls"]) == 2
    assert out["stats"]["decomposed"] and exact_match(out["answer"], ["Paraná River"]), (question, out["answer"])


@pytest.mark.slow
def test_ask_prints_a_trace(smollm2_path, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "contents": '"Eiffel Tower"\nCompleted in 1889 in Paris.'}) + "\n")
    result = run(
        "ask", "When was the Eiffel Tower completed?", "--corpus", str(corpus), "--max-turns", "1", "--llm", "smollm2"
    )
    assert result.returncode == 0, result.stderr
    assert "question" in result.stdout and "answer" in result.stdout and "LLM calls" in result.stdout


def test_bad_input_exits_2_with_a_message(tmp_path):
    result = run("ask", "   ", "--corpus", str(tmp_path / "missing.jsonl"))
    assert result.returncode == 2
    assert "error:" in result.stderr and "question is empty" in result.stderr
    result = run("ask", "Q?", "--llm", "gpt")
    assert result.returncode == 2 and "unknown LLM spec" in result.stderr
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "1", "question": "Q?", "golden_answers": ["a"]}) + "\n")
    result = run("eval", "--data", str(questions), "--out", str(tmp_path / "out"), "--weights", "model.bin")
    assert result.returncode == 2 and "no such file ['model.bin']" in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_ask_prints_untrusted_text_as_text(monkeypatch, tmp_path):
    """Rich markup and terminal escapes in a question, model text or titles are shown, not interpreted."""
    from typer.testing import CliRunner

    from ps_agent.cli import app
    from ps_agent.testing import OpenAIChatDouble

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "contents": '"[/b] Paris [red]"\nThe capital of France.'}) + "\n")
    with OpenAIChatDouble(answer="Paris [citation needed] [/b] \x1b[2J") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "double")
        result = CliRunner().invoke(
            app, ["ask", "Capital [/i] of France?", "--llm", "openai:x", "--corpus", str(corpus)]
        )
    assert result.exit_code == 0, result.output
    assert "Capital [/i] of France?" in result.output and "[/b] Paris [red]" in result.output
    assert "Paris [citation needed] [/b] \\x1b[2J" in result.output and "\x1b" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--llm", "openai:gpt-4o-mini", "--protocol", "tools"], "is the provider's API key set"),
        (["--llm", "vllm:http://127.0.0.1:9/v1", "--protocol", "tools"], "cannot reach the vLLM server"),
        (
            ["--llm", "vllm:http://127.0.0.1:9/v1"],
            "turn 1: ConnectionError: the vLLM server at http://127.0.0.1:9/v1 did not",
        ),
        (["--topk", "100000"], "topk must be an integer from 1 to 50, got 100000"),
        (["--mode", "fast"], "'fast' is not one of"),
    ],
)
def test_service_and_setting_errors_are_one_line(monkeypatch, tmp_path, args, message):
    from typer.testing import CliRunner

    from ps_agent.cli import app

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "contents": '"Paris"\nThe capital of France.'}) + "\n")
    result = CliRunner().invoke(app, ["ask", "Capital of France?", "--corpus", str(corpus), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 6  # one message (typer boxes usage errors in a few lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--data", "q.jsonl", "--out", "o", "--index", "i", "--retriever-url", "http://x"], "not --index and"),
        (
            ["eval", "--data", "q.jsonl", "--out", "o", "--corpus", "c.jsonl", "--retriever-url", "http://x"],
            "not --corpus",
        ),
        (["eval", "--data", "q.jsonl", "--out", "o", "--retriever-url", "notaurl"], "expected a server URL"),
        (["eval", "--data", "q.jsonl", "--out", "README.md"], "is a file: expected an output folder"),  # an OSError
        (["trajectories", "show", "/nonexistent"], "not a folder: /nonexistent"),
        (["trajectories", "show", ".", "--last", "0"], "should be greater than or equal to 1"),
        (["serve-retriever", "--port", "99999"], "should be less than or equal to 65535"),
        (["serve-retriever", "--kind", "hnsw"], "--kind choose among an index folder's indexes: give --index DIR"),
    ],
)
def test_conflicting_or_out_of_range_options_are_usage_errors(args, message):
    """These were a traceback with exit 1 (click's own exceptions, which typer's bundled click does not catch), or
    accepted: a port wrapped modulo 65536, --last 0 showing every rollout, --kind ignored without --index, and
    --corpus silently dropped for --retriever-url."""
    from typer.testing import CliRunner

    from ps_agent.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split()) and "Traceback" not in result.output


def test_trajectories_show_prints_logged_text_as_text(tmp_path):
    from typer.testing import CliRunner

    from ps_agent.cli import app
    from ps_agent.rewards import COMPONENTS
    from ps_agent.trajectories import TrajectoryLog

    TrajectoryLog(tmp_path / "trajectories-0.jsonl").append({
        "step": 3, "question_class": "parallelisable", "question": "Older: [b]A[/b] or \x1b[2JB?",
        "answer": "[/red] A", "golden_answers": ["A"],
        "timeline": {"turns": [], "search_rounds": [{"sub_queries": ["[/i] A", "B"]}]},
        "rewards": dict.fromkeys((*COMPONENTS, "total"), 0.5), "format_valid": True, "decomposed": True,
        "forced_answer": False, "search_rounds": 1,
    })  # fmt: skip
    TrajectoryLog(tmp_path / "trajectories-0.jsonl").append({  # the same group, not split, and rewarded less
        "step": 3, "question_class": "parallelisable", "question": "Older: [b]A[/b] or \x1b[2JB?", "answer": "B",
        "golden_answers": ["A"], "timeline": {"turns": [], "search_rounds": [{"sub_queries": ["A or B"]}]},
        "rewards": dict.fromkeys((*COMPONENTS, "total"), 0.0), "format_valid": True, "decomposed": False,
        "forced_answer": False, "search_rounds": 1,
    })  # fmt: skip
    with (tmp_path / "trajectories-0.jsonl").open("a") as log:
        log.write('{"step": 4}\n')  # not a rollout: a KeyError traceback
        log.write('{"step": 5, "question_class": "parallelisable", "rewards": {"total": 1.0}}\n')  # no parts
    result = CliRunner().invoke(app, ["trajectories", "show", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert re.search(r"split − whole/parallelisable \(n=1\) *│ *\+0\.500", result.output), result.output
    assert "Older: [b]A[/b] or \\x1b[2JB?" in result.output and "'[/red] A'" in result.output
    assert "search: [/i] A ## B" in result.output and "\x1b" not in result.output


@pytest.mark.parametrize("parts", [{}, {"format_valid": True, "decomposed": "yes", "forced_answer": False}])
def test_trajectories_show_says_which_run_holds_a_rollout_of_another_shape(parts, tmp_path):
    """A line with the keys every logged shape has, but not the others the summary reads (or one of them of
    another type), ended in a traceback."""
    from typer.testing import CliRunner

    from ps_agent.cli import app
    from ps_agent.rewards import COMPONENTS

    line = {"step": 0, "question_class": "sequential", "rewards": dict.fromkeys((*COMPONENTS, "total"), 0.0)}
    (tmp_path / "trajectories-0.jsonl").write_text(json.dumps(line | parts) + "\n")
    result = CliRunner().invoke(app, ["trajectories", "show", str(tmp_path)])
    assert result.exit_code == 2 and "a logged rollout is not in the shape training writes" in result.output


def test_ask_and_eval_take_their_settings_and_defaults_from_agent_config():
    """Issue 28: the CLI declared the settings again, and `eval` had no --protocol."""
    import typer.main

    from ps_agent.cli import app
    from ps_agent.configuration import AgentConfig

    commands = typer.main.get_command(app).commands
    defaults = AgentConfig()
    for command in ("ask", "eval"):
        options = {p.name: p for p in commands[command].params if p.param_type_name == "option"}
        for name in ("protocol", "max_turns", "topk", "max_new_tokens", "demonstration"):
            assert options[name].default == getattr(defaults, name), (command, name)


def test_a_trajectory_log_that_cannot_be_read_is_one_line_not_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from ps_agent.cli import app

    (tmp_path / "trajectories-0.jsonl").mkdir()
    result = CliRunner().invoke(app, ["trajectories", "show", str(tmp_path)])
    assert result.exit_code == 2 and "error: [Errno 21] Is a directory" in result.output, result.output
    assert "Traceback" not in result.output
