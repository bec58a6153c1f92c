"""What an eval folder's answers came from, and who may write there.

``provenance`` records what reproduces a run's numbers (the command, the settings, checksums of the model's
weights and of the data). Given a folder's last run (``recorded_run``), ``check_same_model`` refuses to resume a
folder answered by another model, since its answers would be counted as this one's, and ``check_same_settings``
one answered with other settings;
``writing_to`` keeps a second eval out of a folder one is writing to.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import fields
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from ps_agent.cache import file_checksum
from ps_agent.configuration import RESOURCES, AgentConfig
from ps_agent.llms import EMBEDDED_BASES, embedded_base, embedded_spec, policies_dir
from ps_agent.protocol import Mode
from ps_agent.questions import SPLIT, dataset_name
from ps_agent.trajectories import read_records

if TYPE_CHECKING:
    from ps_agent.eval import EvalSettings


def recorded_run(out_dir: Path) -> dict[str, Any] | None:
    """The record of the last run that answered into ``out_dir``: None where the folder holds no answer (nothing
    to resume: error lines run again), ``{}`` where its answers are not on record."""
    lines = read_records(sorted((out_dir / "results").glob("*.jsonl")))
    if all(line.get("error") is not None for line in lines):
        return None
    runs = read_records([out_dir / "runs.jsonl"]) if (out_dir / "runs.jsonl").is_file() else []
    if not runs:
        return {}
    # each dataset's file as the last run that read it held it: a run on another set in between, or the same file
    # spelt another way, must not hide a change to it
    held = {dataset_name(Path(path)): sha for run in runs for path, sha in run.get("data_sha1", {}).items()}
    return runs[-1] | {"dataset_sha1": held}


def check_same_model(out_dir: Path, llm: str, model_sha1: dict[str, str], earlier: dict[str, Any] | None) -> None:
    """A run resumes into ``out_dir``, skipping the questions answered there: refuse when they were answered by
    other weights, or by weights not on record, since their answers would be counted as this model's.

    ``model_sha1``: this run's model identity (``model_checksums``). Empty for a Python model object given no
    ``weights``: then the folder must hold no record either. A served model (``vllm:URL``) can
    change behind its URL, so resuming its answers needs its ``weights``. ``earlier``: ``recorded_run(out_dir)``."""
    if earlier is None:
        return
    held = earlier.get("model_sha1")
    same = held is not None and Counter(held.values()) == Counter(model_sha1.values())  # by content, not path:
    if same and (model_sha1 or not llm.startswith("vllm:")):  # an adapter moved or copied is the same model
        return
    answered_by = f"other model weights ({earlier['settings']['llm']}: {held})" if held else "weights not on record"
    this = f"{llm}: {model_sha1}" if model_sha1 else f"{llm}, whose weights are not on record (pass --weights)"
    raise ValueError(
        f"{out_dir} holds answers of {answered_by}, not of this run's ({this}); a rerun there skips the "
        "questions already answered and would count those answers as this model's: give another output "
        "folder, or remove that one to evaluate again"
    )


def check_same_settings(out_dir: Path, run: dict[str, Any], earlier: dict[str, Any] | None) -> None:
    """A run resumes into ``out_dir``, skipping the questions answered there: refuse when they were answered with
    other agent settings (``max_turns``, ``topk``, …; unset is the default), another retriever, another part of the
    split or the same part of another split (``questions.SPLIT``), or another version of a question file, since the
    report would give those answers as this run's. ``earlier``: ``recorded_run(out_dir)`` (answers not on record are
    ``check_same_model``'s to refuse)."""
    if not earlier:
        return
    then, now = earlier.get("settings", {}), run["settings"]
    changed = [
        f"{key} {_json(then[key])} (now {_json(now[key])})"
        for key in ("agent", "retriever", "retriever_sha1", "part")
        if key in then and _json(then[key]) != _json(now[key])
    ]
    if now["part"] != "all" and then.get("split", "id-hash") != now["split"]:  # the same part of another split
        changed.append(f"split {_json(then.get('split', 'id-hash'))} (now {_json(now['split'])})")
    held = earlier.get("dataset_sha1", {})
    changed += [
        f"{path} (its contents, since the folder's answers to {dataset_name(Path(path))!r})"
        for path, sha in run["data_sha1"].items()
        if held.get(dataset_name(Path(path)), sha) != sha
    ]
    if changed:
        raise ValueError(
            f"{out_dir} holds answers given with other settings: {'; '.join(changed)}; a rerun there skips the "
            "questions already answered and would report those answers as this run's: give another output "
            "folder, or run with the settings the folder's runs.jsonl records"
        )


def _json(value: Any) -> str:
    """``value`` as JSON (a recorded setting and a live one compare alike); agent settings with their defaults."""
    if isinstance(value, dict):
        defaults = {f.name: getattr(AgentConfig(), f.name) for f in fields(AgentConfig) if f.name not in RESOURCES}
        value = defaults | value
    return json.dumps(value, sort_keys=True, default=str)


def model_checksums(settings: EvalSettings) -> dict[str, str]:
    """A run's model identity: checksums of ``settings.weights`` and of the weight files its spec names, the
    pinned GGUF checksum of the embedded base a spec runs on (``smollm2-base`` is not ``smollm2``), or an API
    model's name."""
    files = sorted({Path(path) for path in settings.weights} | set(model_files(settings.llm)))
    identity = {str(path): file_checksum(path) for path in files}
    llm = settings.llm
    if not identity and isinstance(llm, str) and ":" in llm and not llm.startswith(("vllm:", "hf:")):
        identity["spec"] = llm  # an API model (provider:model): its name is all there is to tell it apart
    base = embedded_base(settings.llm) if isinstance(settings.llm, str) else None
    base = base or (EMBEDDED_BASES.get(settings.llm) if isinstance(settings.llm, str) else None)
    if base is not None:
        identity[f"{base.name} (embedded base, GGUF sha256)"] = base.sha256
    return identity


WEIGHTS = ("*.safetensors", "*.bin")  # a model's weight files, sharded or not


def model_files(llm: Any) -> list[Path]:
    """The weights an LLM spec names on this machine (a shipped adapter, an ``hf:`` folder), to checksum."""
    if not isinstance(llm, str):
        return []
    folders = [policies_dir() / embedded_spec(llm, mode) for mode in get_args(Mode)] + [Path(llm.removeprefix("hf:"))]
    return weight_files_in(folders)


def weight_files_in(folders: list[Path]) -> list[Path]:
    """The weight files (``*.safetensors``, ``*.bin``, sharded or not) of those of ``folders`` that exist, folder by
    folder in the order given (a base before its adapter, wherever each lives), by name within a folder."""
    found = dict.fromkeys(
        path
        for folder in folders
        if folder.is_dir()
        for path in sorted({p for kind in WEIGHTS for p in folder.glob(kind)})
    )
    return list(found)


def git_commit() -> str | None:
    """The commit of the checkout this package runs from, when it is one."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def provenance(settings: EvalSettings, data: list[Path]) -> dict[str, Any]:
    """What reproduces a run's numbers: the command, the settings, and checksums of model weights and data (a
    corpus file's too: a rerun from another folder names the same file by another relative path, or another file by
    the same one)."""
    retriever = settings.retriever
    local = Path(retriever) if isinstance(retriever, (str, Path)) and Path(retriever).exists() else None
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(sys.argv),
        "settings": {
            "llm": str(settings.llm),
            "retriever": str(local.resolve() if local else retriever),
            "retriever_sha1": file_checksum(local) if local and local.is_file() else None,
            "modes": list(settings.modes),
            "concurrency": settings.concurrency,
            "limit": settings.limit,
            "agent": settings.agent,
            "part": settings.part,
            "split": SPLIT,
            "weights": [str(path) for path in settings.weights],
        },
        "model_sha1": model_checksums(settings),
        "data_sha1": {str(path): file_checksum(path) for path in data},
        "parallelsearch": version("parallelsearch"),
        "git_commit": git_commit(),
    }


@contextlib.contextmanager
def writing_to(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` for one eval: a second one there would run every question again beside the first.
    The lock is the kernel's (``flock``), so it goes with the process however that ends."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / ".lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise ValueError(
                f"{out_dir} is being written by another eval ({holder}); wait for it to end, or give another --out"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield
