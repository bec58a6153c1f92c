"""LangGraph Studio: the real ``langgraph dev`` server serves ``graph``, shows its settings and completes a run; a
thread's second run starts afresh."""

import asyncio
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from ps_agent import AgentConfig
from ps_agent.processes import free_port, served

ROOT = Path(__file__).resolve().parents[1]
EIFFEL = "Which is older, the Eiffel Tower or the Statue of Liberty?"
#: the runs' policy: an offered name, SmolLM2's for speed (these tests are of the server; the default policy's
#: runs are tested in test_llms.py and test_cli.py)
RUN = {"llm": "smollm2", "mode": "sequential"}


@pytest.fixture(scope="module")
def langgraph_dev(smollm2_path, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The real ``langgraph dev`` on 127.0.0.1 serving ``langgraph.json``: its URL and its log."""
    langgraph = shutil.which("langgraph", path=str(Path(sys.executable).parent))
    if langgraph is None:
        pytest.skip("langgraph-cli[inmem] is not installed (pip install -e '.[studio]')")
    port = free_port()
    log = tmp_path_factory.mktemp("langgraph-dev") / "langgraph-dev.log"
    command = [langgraph, "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port)]
    env = os.environ | {"LANGSMITH_TRACING": "false", "LANGGRAPH_CLI_NO_ANALYTICS": "1"}
    with served(command, f"http://127.0.0.1:{port}/ok", log, timeout_s=120, cwd=ROOT, env=env):
        yield f"http://127.0.0.1:{port}", log


@pytest.mark.slow
def test_langgraph_dev_serves_the_graph(langgraph_dev, tmp_path):
    from langgraph_sdk import get_client

    url, log = langgraph_dev

    async def run() -> tuple[dict, dict]:
        client = get_client(url=url)
        assistants = await client.assistants.search(graph_id="parallel_search")
        assert assistants, "graph 'parallel_search' is not served"
        schemas = await client.assistants.get_schemas(assistants[0]["assistant_id"])
        refused = [
            await client.runs.wait(None, "parallel_search", input={"question": "Q?"}, raise_error=False, **chosen)
            for chosen in (
                {"context": {"corpus": str(secret)}},
                {"config": {"configurable": {"llm": f"vllm:{url}/v1"}}},
                {"context": {"search_retries": 10**9}},
            )
        ]
        thread = await client.threads.create()  # Studio's way: runs on a thread, whose state is kept
        config = {"configurable": {"max_turns": 1, "max_new_tokens": 64} | RUN}
        results = [
            await client.runs.wait(thread["thread_id"], "parallel_search", input={"question": q}, config=config)
            for q in ("Which river is longer, the Nile or the Amazon?", EIFFEL)
        ]
        return schemas, refused, results[-1]

    secret = tmp_path / "private.jsonl"  # a server file a client must not be able to read
    secret.write_text('{"id": "1", "contents": "\\"Secret\\"\\nthe operator\'s private line"}\n')
    schemas, refused, result = asyncio.run(run())
    expected = [
        "corpus a str is not offered here",
        "is not offered here: choose one of qwen0.5b,",
        "search_retries",
    ]
    for run_output, message in zip(refused, expected, strict=True):  # issue 27: only the operator's names
        assert message in str(run_output) and "private line" not in str(run_output), run_output
    # the form Studio shows for a run: a null schema (pydantic refused typing.TypedDict on 3.11) showed none
    assert schemas["input_schema"]["required"] == ["question"], schemas["input_schema"]
    assert {"answer", "trajectory", "stats"} <= set(schemas["output_schema"]["properties"])
    settings = schemas["context_schema"]["properties"]  # what Studio shows as the assistant's settings
    assert sorted(settings) == sorted(f.name for f in fields(AgentConfig))
    assert settings["mode"]["enum"] == ["parallel", "sequential"] and settings["topk"]["default"] == 3
    assert all(setting.get("description") for setting in settings.values())
    assert "smollm2-searchr1" in settings["llm"]["anyOf"][0]["enum"]  # Studio offers the names, not free text
    assert "__error__" not in result, f"{result}\n{log.read_text()[-3000:]}"
    assert isinstance(result["answer"], str)
    assert result["trajectory"]["mode"] == "sequential"
    assert result["stats"]["llm_calls"] == len(result["trajectory"]["llm_calls"]) <= 2
    first_prompt = result["trajectory"]["llm_calls"][0]["prompt"]  # the thread's second run starts afresh
    assert result["trajectory"]["question"] == EIFFEL and "Nile" not in first_prompt, first_prompt


@pytest.mark.slow
def test_served_graph_refuses_what_skips_its_checks(langgraph_dev):
    """A client may not reach the nodes past ``prepare``: a run's ``command``, a run with no input and an edit of a
    thread's state are refused (403, saying what the server takes); Studio keeps them, and a run that starts with
    an input starts afresh after an edit; a metadata patch stays open. A run whose context or input the graph
    would not take as sent is refused (422) for every client."""
    import httpx

    url, log = langgraph_dev
    config = {"configurable": {"max_turns": 1, "max_new_tokens": 48} | RUN}
    edit = {"values": {"answer": "Forged", "question": "Forged?"}, "as_node": "prepare"}
    studio = {"x-auth-scheme": "langsmith"}  # what Studio sends; `langgraph dev` takes it as the operator
    with httpx.Client(base_url=url, timeout=300) as client:
        thread = client.post("/threads", json={}).json()["thread_id"]
        cron = client.post(  # a cron with a question (Jan 1st): open
            "/runs/crons",
            json={"assistant_id": "parallel_search", "schedule": "0 0 1 1 *", "input": {"question": "Q?"}},
        )
        refused = {
            "command": client.post(
                f"/threads/{thread}/runs/wait", json={"assistant_id": "parallel_search", "command": {"goto": "search"}}
            ),
            "no input": client.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "parallel_search"}),
            "stateless command": client.post(
                "/runs/wait", json={"assistant_id": "parallel_search", "command": {"update": {"answer": "Forged"}}}
            ),
            "state edit": client.post(f"/threads/{thread}/state", json=edit),
            "cron with no input": client.post(
                "/runs/crons", json={"assistant_id": "parallel_search", "schedule": "0 0 1 1 *"}
            ),
        }
        malformed = {  # what the server would drop, the run going on with defaults: refused, the operator's too
            "misspelt setting": client.post(
                "/runs/wait",
                json={"assistant_id": "parallel_search", "input": {"question": "Q?"}, "context": {"max_turn": 1}},
            ),
            "setting in the input": client.post(
                "/runs/wait",
                json={"assistant_id": "parallel_search", "input": {"question": "Q?", "max_turns": 1}},
                headers=studio,
            ),
        }
        preset_id = str(uuid.uuid4())  # a new thread created with a state
        preset = client.post("/threads", json={"thread_id": preset_id, "supersteps": [{"updates": [edit]}]})
        patched = client.patch(f"/threads/{thread}", json={"metadata": {"graph_id": "parallel_search"}})
        by_studio = client.post(f"/threads/{thread}/state", json=edit, headers=studio)
        after = client.post(
            f"/threads/{thread}/runs/wait",
            json={"assistant_id": "parallel_search", "input": {"question": EIFFEL}, "config": config},
        )
        values = [client.get(f"/threads/{t}/state").json()["values"] for t in (preset_id, thread)]
    for what, response in refused.items():
        assert response.status_code == 403, (what, response.status_code, response.text)
        assert '{"question": "..."}' in response.json()["detail"], (what, response.text)
    for what, response in malformed.items():
        assert response.status_code == 422, (what, response.status_code, response.text)
    assert "unknown setting 'max_turn' (did you mean 'max_turns'?)" in malformed["misspelt setting"].json()["detail"]
    assert "got the keys ['max_turns', 'question']" in malformed["setting in the input"].json()["detail"]
    assert "Forged" not in str(values[0]) and "would skip the graph's checks" in preset.text, preset.text
    assert patched.status_code == 200 and by_studio.status_code == 200, (patched.text, by_studio.text)
    assert cron.status_code == 200, cron.text
    result = after.json()
    assert "__error__" not in result, f"{result}\n{log.read_text()[-3000:]}"
    assert result["trajectory"]["question"] == EIFFEL and result["answer"] != "Forged", result
    assert values[1]["question"] == EIFFEL and "Forged" not in str(values[1]["trajectory"]), values[1]
