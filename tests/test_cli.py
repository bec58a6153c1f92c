"""The ``ps-agent`` command line, run as a real subprocess."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PS_AGENT = shutil.which("ps-agent", path=str(Path(sys.executable).parent)) or "ps-agent"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PS_AGENT, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_ask_json_on_embedded_defaults(smollm2_path):
    result = run("ask", "Which is older, the Eiffel Tower or the Statue of Liberty?", "--json", "--max-turns", "1")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"answer", "trajectory", "stats"}
    assert out["stats"]["llm_calls"] == len(out["trajectory"]["llm_calls"]) <= 2


@pytest.mark.slow
def test_ask_prints_a_trace(smollm2_path, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "contents": '"Eiffel Tower"\nCompleted in 1889 in Paris.'}) + "\n")
    result = run("ask", "When was the Eiffel Tower completed?", "--corpus", str(corpus), "--max-turns", "1")
    assert result.returncode == 0, result.stderr
    assert "question" in result.stdout and "answer" in result.stdout and "LLM calls" in result.stdout


def test_bad_input_exits_2_with_a_message(tmp_path):
    result = run("ask", "   ", "--corpus", str(tmp_path / "missing.jsonl"))
    assert result.returncode == 2
    assert "error:" in result.stderr and "question is empty" in result.stderr
    result = run("ask", "Q?", "--llm", "gpt")
    assert result.returncode == 2 and "unknown LLM spec" in result.stderr
