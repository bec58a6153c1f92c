"""LLM specs (strings or LangChain models) resolved to the policy or chat model a protocol needs."""

from __future__ import annotations

import contextlib
import gc
import threading
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel, BaseLLM

from ps_agent.llms.adapters import load_adapter_model
from ps_agent.llms.base import LLMSpecError, TextPolicy
from ps_agent.llms.embedded import embedded_base, embedded_model_path, embedded_spec, policies_dir
from ps_agent.llms.langchain import LangChainChatPolicy, LangChainLLMPolicy
from ps_agent.llms.local import TransformersPolicy
from ps_agent.llms.vllm import OpenAICompletionsPolicy

SPEC_FORMS = (
    "an embedded model: 'qwen0.5b' (Qwen2.5-Coder-0.5B-Instruct) or 'smollm2' (SmolLM2-135M-Instruct), each with the "
    "trained adapter of the mode, or as NAME-parallelsearch, NAME-searchr1, NAME-base (untrained); "
    "'hf:PATH' (local transformers model or PEFT adapter folder), "
    "'vllm:http://HOST:PORT/v1' (OpenAI-compatible server), 'provider:model' (as langchain's init_chat_model), "
    "or a LangChain BaseChatModel/BaseLLM instance"
)

_SPEC_LOCK = threading.Lock()


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


def _transformers_policy(path: Path) -> TransformersPolicy:
    """``hf:PATH``: a transformers model folder, or a PEFT adapter folder on its base."""
    if (path / "adapter_config.json").is_file():
        return TransformersPolicy(*load_adapter_model(path))
    return TransformersPolicy.from_pretrained(path)


#: the policies of spec strings, each loaded once from what its folder held (``_source``), newest used last
_loaded: dict[tuple[str, tuple], TextPolicy] = {}
_MAX_LOADED = 8


def _source(spec: str) -> tuple:
    """What a spec's trained weights are loaded from: the adapter or model folder (an ``hf:`` one, or a shipped
    adapter's under ``policies_dir()``) and its files' sizes and modification times; ``()`` for the rest."""
    base = embedded_base(spec)
    if spec.startswith("hf:"):
        folder = Path(spec.removeprefix("hf:"))
    elif base is not None and spec != f"{base.name}-base":
        folder = policies_dir() / spec
    else:
        return ()
    stats = []
    for file in sorted(folder.iterdir()) if folder.is_dir() else []:
        with contextlib.suppress(OSError):  # removed meanwhile (a checkpoint rotated out): not a file it loads
            stat = file.stat()
            stats.append((file.name, stat.st_size, stat.st_mtime_ns))
    return (str(folder.resolve()), *stats)


def _loaded_policy(spec: str) -> TextPolicy:
    """The policy of ``spec``, loaded on first use, and again once its folder changed (retrained in place, or
    another ``PS_AGENT_POLICIES``): the one loaded before would answer for weights it is not (call under
    ``_SPEC_LOCK``)."""
    key = (spec, _source(spec))
    policy = _loaded.pop(key, None)
    for stale in [k for k in _loaded if k[0] == spec]:
        _close(_loaded.pop(stale))
    _loaded[key] = policy = _text_policy_from_spec(spec) if policy is None else policy
    if len(_loaded) > _MAX_LOADED:
        _close(_loaded.pop(next(iter(_loaded))))  # the least recently used
    return policy


def _close(policy: TextPolicy) -> None:
    if isinstance(policy, TransformersPolicy):
        policy.close()  # its generation thread may still hold the model for a moment after the last turn


def _text_policy_from_spec(spec: str) -> TextPolicy:
    base = embedded_base(spec)
    if base is not None and spec == f"{base.name}-base":
        return TransformersPolicy.from_pretrained(embedded_model_path(base))
    if base is not None:
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
            return _loaded_policy(embedded_spec(llm, mode))
    if isinstance(llm, BaseChatModel):
        return LangChainChatPolicy(llm)
    if isinstance(llm, BaseLLM):
        return LangChainLLMPolicy(llm)
    if isinstance(llm, TextPolicy):
        return llm
    raise LLMSpecError(f"cannot use {type(llm).__name__} as an LLM: expected {SPEC_FORMS}")


def release_text_policies() -> None:
    """Forget the policies loaded from spec strings, so that each one's weights are freed once nothing else holds
    it. A process that answers with several policies in turn (a benchmark) then holds one at a time; a later
    ``resolve_text_policy`` of a spec loads it again."""
    with _SPEC_LOCK:
        released = list(_loaded.values())
        _loaded.clear()
    for policy in released:
        _close(policy)
    released = policy = None
    gc.collect()


def text_model_spec(llm: Any) -> bool:
    """Whether ``llm`` is a spec of a model that speaks text only (an embedded name, an ``hf:`` folder): the tools
    protocol needs a chat model (``vllm:URL``, ``provider:model`` or a LangChain object)."""
    return isinstance(llm, str) and (llm.startswith("hf:") or ":" not in llm)


def resolve_chat_model(llm: Any) -> BaseChatModel:
    """A tool-calling chat model for the tools protocol."""
    if isinstance(llm, BaseChatModel):
        if type(llm).bind_tools is BaseChatModel.bind_tools:  # LangChain's own raises a bare NotImplementedError
            raise LLMSpecError(
                f"the tools protocol needs a chat model with tool calling, and {type(llm).__name__} has none (no "
                "bind_tools): use protocol='tags', which any chat model or LLM speaks"
            )
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
    if isinstance(llm, str) and not text_model_spec(llm):
        return _init_chat_model(llm)
    raise LLMSpecError(
        f"the tools protocol needs a chat model with tool calling, got {llm!r}: expected a LangChain "
        "BaseChatModel, 'vllm:http://HOST:PORT/v1' or 'provider:model'; use protocol='tags' for the embedded model"
    )
