"""A server's reason for a refusal, as the vLLM and retrieval clients report it."""

from __future__ import annotations

import httpx
import pytest

from ps_agent.http_clients import server_reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"detail": "at most 2 queries"}, "at most 2 queries"),  # FastAPI's HTTPException
        (
            {
                "detail": [
                    {"loc": ["body", "queries"], "msg": "field required"},
                    {"loc": ["body", "topk"], "msg": "> 0"},
                ]
            },
            "body.queries: field required; body.topk: > 0",
        ),  # FastAPI's validation errors
        ({"object": "error", "message": "The model `x` does not exist.", "code": 404}, "The model `x` does not exist."),
        ({"error": {"message": "prompt too long", "type": "BadRequestError"}}, "prompt too long"),  # OpenAI's form
        ({"detail": None, "message": "out of memory"}, "out of memory"),  # a null detail hides nothing
        ({"detail": "", "error": {"message": "busy"}}, "busy"),
        ({"detail": []}, '{"detail":[]}'),  # nothing said: the body
        ({"result": []}, '{"result":[]}'),  # JSON that says no reason: the body
        (["not", "an", "object"], '["not","an","object"]'),
    ],
)
def test_a_refusal_s_reason_is_read_from_each_servers_json(body, reason):
    assert server_reason(httpx.Response(400, json=body)) == reason


def test_a_refusal_that_is_not_json_is_its_body_cut_to_the_limit():
    assert server_reason(httpx.Response(502, text="Bad Gateway" + "!" * 900), limit=20) == "Bad Gateway!!!!!!!!!"
