"""LLM backends: spec resolution, and token exactness of the real embedded model and a real vLLM server."""

import asyncio
import json
import shutil

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from ps_agent.llms import (
    EMBEDDED_BASE,
    LLMSpecError,
    OpenAICompletionsPolicy,
    TransformersPolicy,
    load_adapter_model,
    policies_dir,
    resolve_chat_model,
    resolve_text_policy,
    transcript_messages,
)
from ps_agent.protocol import STOP_SEQUENCES, SubQueryObservation, render_chat_prompt, render_information

QUESTION = "Which is older, the Eiffel Tower or the Statue of Liberty?"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpt", "unknown LLM spec 'gpt'"),
        ("vllm:localhost:8000", "expected 'vllm:http://HOST:PORT/v1'"),
        ("hf:/no/such/model", "hf: model path not found"),
        ("nosuchprovider:model", "cannot resolve LLM spec"),
    ],
)
def test_bad_specs_say_what_was_expected(spec, message):
    with pytest.raises(LLMSpecError, match=message):
        resolve_text_policy(spec)


def test_bad_objects_and_tools_without_chat_model():
    with pytest.raises(LLMSpecError, match="cannot use int as an LLM"):
        resolve_text_policy(3)
    with pytest.raises(LLMSpecError, match="tools protocol needs a chat model"):
        resolve_chat_model("smollm2")


def test_transcript_becomes_alternating_chat_turns():
    messages = transcript_messages(
        [{"role": "user", "content": "P"}],
        [
            {"role": "model", "text": "<search> q </search>", "token_ids": None},
            {"role": "env", "text": "<information>i</information>", "token_ids": None},
            {"role": "env", "text": " forced", "token_ids": None},
        ],
    )
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, HumanMessage]
    assert messages[2].content == "<information>i</information> forced"


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(smollm2_path)


@pytest.mark.slow
def test_embedded_model_is_token_exact(smollm2):
    prompt = render_chat_prompt(QUESTION)
    first = smollm2.complete(prompt, [], stop=STOP_SEQUENCES, max_tokens=48)
    assert first.token_ids and len(first.token_ids) == len(first.logprobs) == first.completion_tokens
    assert smollm2.tokenizer.decode(first.token_ids, skip_special_tokens=True) == first.text
    assert all(lp <= 0 for lp in first.logprobs)
    observation = render_information([SubQueryObservation("q", [("Eiffel Tower", "Completed in 1889.")])])
    transcript = [
        {"role": "model", "text": first.text, "token_ids": first.token_ids},
        {"role": "env", "text": observation, "token_ids": None},
    ]
    context = smollm2.context_ids(prompt, transcript)
    prompt_ids = smollm2.prompt_ids(prompt)
    observation_ids = smollm2.tokenizer(observation, add_special_tokens=False).input_ids
    assert context == prompt_ids + first.token_ids + observation_ids  # no decode→re-encode of model tokens
    second = smollm2.complete(prompt, transcript, stop=STOP_SEQUENCES, max_tokens=16)
    assert second.prompt_tokens == len(context)


@pytest.mark.slow
def test_vllm_server_matches_the_embedded_model(vllm_server, smollm2):
    policy = OpenAICompletionsPolicy(vllm_server)
    prompt = render_chat_prompt(QUESTION)
    served = asyncio.run(policy.acomplete(prompt, [], stop=STOP_SEQUENCES, max_tokens=32))
    local = smollm2.complete(prompt, [], stop=STOP_SEQUENCES, max_tokens=32)
    assert served.token_ids == local.token_ids  # greedy on both, same weights, same chat template
    assert served.prompt_tokens == len(smollm2.prompt_ids(prompt))
    assert len(served.logprobs) == len(served.token_ids)
    # vLLM CPU kernels compute in bf16: same tokens, log-probs within a small tolerance
    assert served.logprobs == pytest.approx(local.logprobs, abs=0.3)


# --- the shipped policies ----------------------------------------------------------------------


def test_a_missing_adapter_or_another_base_is_refused_naming_both(tmp_path, smollm2_path):
    with pytest.raises(LLMSpecError, match=r"adapter folder .*none is missing or incomplete: expected adapter_config"):
        load_adapter_model(tmp_path / "none")
    shipped = policies_dir() / "smollm2-parallelsearch"
    other = tmp_path / "qwen-adapter"
    shutil.copytree(shipped, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "Qwen2.5-7B"}))
    with pytest.raises(
        LLMSpecError, match=r"trained on base model 'Qwen2.5-7B', but the base model given is .*smollm2"
    ):
        load_adapter_model(other, base=smollm2_path)
    with pytest.raises(LLMSpecError, match=r"base model Qwen2.5-7B of adapter .* not found"):
        load_adapter_model(other)


@pytest.mark.parametrize("name", ["smollm2-parallelsearch", "smollm2-searchr1"])
def test_shipped_adapters_are_small_and_name_the_embedded_base(name):
    folder = policies_dir() / name
    assert (folder / "adapter_model.safetensors").stat().st_size <= 10_000_000
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == EMBEDDED_BASE
    assert "## Measured" in (folder / "README.md").read_text()  # the model card carries the numbers


@pytest.mark.slow
def test_each_mode_gets_its_own_trained_policy_by_default(smollm2_path):
    parallel, sequential = resolve_text_policy(None, "parallel"), resolve_text_policy("smollm2", "sequential")
    assert parallel is resolve_text_policy("smollm2-parallelsearch")
    assert sequential is resolve_text_policy("smollm2-searchr1")
    base = resolve_text_policy("smollm2-base")
    weights = [dict(p.model.named_parameters())["model.layers.0.self_attn.q_proj.weight"] for p in (parallel, base)]
    assert not weights[0].equal(weights[1])  # the adapter is merged into the trained policy's weights


@pytest.mark.slow
def test_the_default_agent_decomposes_held_out_comparisons(tmp_path):
    """Decomposition as the paper counts it: several sub-queries in one search round (rates: benchmarks/learning.py)."""
    from ps_agent import ParallelSearchAgent
    from ps_agent.rewards import format_valid
    from ps_agent.synthetic import generate

    corpus, questions = generate(seed=7, entities=300, out=tmp_path, per_family=2)  # a world never trained on
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    comparisons = [q for q in rows if q["family"] == "comparison" and q["k"] <= 3][:3]
    agent = ParallelSearchAgent(retriever=str(corpus))
    outs = agent.batch([q["question"] for q in comparisons])
    for q, out in zip(comparisons, outs, strict=True):
        searched = out["trajectory"]["search_rounds"][0]["searched"]
        assert len(set(searched)) >= 2, (q["question"], searched)  # the untrained base splits none (learning.md)
        assert format_valid(out["trajectory"]) and not out["stats"]["forced_answer"]
