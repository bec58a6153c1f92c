"""LLM backends: spec resolution, and token exactness of the real embedded model and a real vLLM server."""

import asyncio

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from ps_agent.llms import (
    LLMSpecError,
    OpenAICompletionsPolicy,
    TransformersPolicy,
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
