"""A vLLM OpenAI-compatible server as a token-exact policy (``vllm:http://HOST:PORT/v1``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import httpx

from ps_agent.http_clients import LoopClients, server_reason
from ps_agent.llms.base import Completion, ContextFull, plain_text
from ps_agent.llms.tokens import context_ids
from ps_agent.protocol import ChatPrompt
from ps_agent.state import Segment


class OpenAICompletionsPolicy:
    """A vLLM OpenAI-compatible server, token-exact: prompts are sent as token ids.

    Uses vLLM's ``/tokenize`` (chat template applied server-side) and the completions extensions
    ``return_token_ids`` and ``include_stop_str_in_output``. One pooled connection set per event loop,
    closed when that loop shuts down or by ``aclose()``.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        timeout_s: float = 300.0,
        tokenizer: Any = None,
    ) -> None:
        self.tokenizer = tokenizer  # when given, contexts are tokenised locally with it (the trainer's)
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self.model = model
        self.max_model_len: int | None = None  # the served window, from /models (vLLM reports it)
        self.temperature = temperature
        self.top_p = top_p
        self.clients = LoopClients(timeout=timeout_s)

    async def aclose(self) -> None:
        """Close the running loop's connections (a later call opens new ones)."""
        await self.clients.aclose()

    async def _model_name(self, client: httpx.AsyncClient) -> str:
        if self.max_model_len is None:  # once: the served window (vLLM reports it), and the model when not given
            response = await client.get(f"{self.base_url}/models")
            if self.model is None:
                raise_for_status(response)
            cards = response.json()["data"] if response.is_success else []
            if self.model is None and not cards:
                raise ValueError(f"{self.base_url}/models lists no model: expected a server serving one")
            # a model named but not listed (an adapter loaded later) has no window on record: it is not checked
            card = next((c for c in cards if c["id"] == self.model), {}) if self.model else cards[0]
            self.model = self.model or card["id"]
            # a LoRA adapter's card reports no window: it is its parent's (the base model it was loaded on)
            parent = next((c for c in cards if c["id"] == card.get("parent")), {})
            self.max_model_len = card.get("max_model_len") or parent.get("max_model_len") or 0  # 0: not checked
        return self.model

    @staticmethod
    async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any], attempts: int = 3) -> httpx.Response:
        """POST ``body``, again when the connection breaks before an answer: a pooled keep-alive connection the
        server closed while it sat idle (uvicorn drops them after 5 s, e.g. while a turn's searches run) fails on
        reuse. The request has no side effect, so sending it again is safe."""
        for _ in range(attempts - 1):
            with contextlib.suppress(httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
                return await client.post(url, json=body)
        return await client.post(url, json=body)

    async def _tokenize(self, client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
        response = await self._post(client, f"{self.root_url}/tokenize", body)
        raise_for_status(response)
        return response.json()["tokens"]

    async def _context(
        self, client: httpx.AsyncClient, model: str, prompt: ChatPrompt, transcript: Sequence[Segment]
    ) -> list[int]:
        """The turn's context ids: with the local tokenizer when given, else by the server's ``/tokenize``."""
        if self.tokenizer is not None:
            return context_ids(self.tokenizer, prompt, transcript)
        chat = {"model": model, "messages": list(prompt), "add_generation_prompt": True}
        context = await self._tokenize(client, chat)
        for segment in transcript:
            context += segment["token_ids"] or await self._tokenize(
                client, {"model": model, "prompt": segment["text"], "add_special_tokens": False}
            )
        return context

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        """The next turn from the server, as exact token ids with their log-probs; a server that cannot be reached
        is a ``ConnectionError`` that names its URL."""
        try:
            return await self._complete(prompt, transcript, stop=stop, max_tokens=max_tokens)
        except httpx.TransportError as exc:
            raise ConnectionError(
                f"the vLLM server at {self.base_url} did not answer ({type(exc).__name__}: {exc or 'no reason given'}):"
                " is it running, at that URL?"
            ) from exc

    async def _complete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        client = await self.clients.get()
        model = await self._model_name(client)
        context = await self._context(client, model, prompt, transcript)
        if self.max_model_len:  # the turn gets the room left in the window; none left is an error that says so
            room = self.max_model_len - len(context)
            if room < 1:
                raise ContextFull(
                    f"the context of {len(context)} tokens fills the served model's window (max_model_len "
                    f"{self.max_model_len}): fewer turns, sub-queries or passages, or a server with a longer window"
                )
            max_tokens = min(max_tokens, room)
        response = await self._post(
            client,
            f"{self.base_url}/completions",
            {
                "model": model,
                "prompt": context,
                "max_tokens": max_tokens,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "stop": list(stop),
                "include_stop_str_in_output": True,
                "logprobs": 0,
                "return_token_ids": True,
            },
        )
        raise_for_status(response)
        choice = response.json()["choices"][0]
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        return Completion(
            text=choice["text"],
            prompt_text=plain_text(prompt, transcript),
            prompt_tokens=len(context),
            completion_tokens=len(token_ids) if token_ids is not None else None,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason"),
        )


def raise_for_status(response: httpx.Response) -> None:
    """httpx's ``raise_for_status``, with the server's own reason (``server_reason``: a model it does not serve, a
    prompt longer than its window), which httpx's message leaves out."""
    if response.is_error:
        raise httpx.HTTPStatusError(
            f"{response.request.method} {response.request.url} answered {response.status_code}: "
            f"{server_reason(response)}",
            request=response.request,
            response=response,
        )
