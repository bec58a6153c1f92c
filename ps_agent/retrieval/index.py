"""Index folders: built resumably from a streamed corpus, loaded only when their manifest matches.

    ps-agent index build --corpus FILE --encoder minilm --index flat --out DIR

A folder holds::

    build.json          the build's plan (corpus fingerprint, encoder): a rerun continues only the same build
    passages.arrow      the passage store (Arrow IPC, memory-mapped when searching)
    embeddings/NNNNN.npy  passage embeddings in shards of ``shard_size`` rows (each written whole, then renamed)
    flat.faiss hnsw.faiss ivfpq.faiss  bm25/
    manifest.json       written last: index types, encoder (and its local folder's checksum), dimension, count,
                        corpus checksum
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
from tqdm.auto import tqdm

from ps_agent.cache import written_whole
from ps_agent.retrieval.base import Retriever
from ps_agent.retrieval.bm25 import BM25Retriever
from ps_agent.retrieval.corpus import CorpusError
from ps_agent.retrieval.dense import DENSE_TYPES, DenseRetriever, HybridRetriever, new_index, on_gpu_if_present
from ps_agent.retrieval.encoders import Encoder, canonical_name, encoder_checksum, load_encoder, resolve_dtype
from ps_agent.retrieval.store import PassageStore, corpus_fingerprint, iter_corpus

logger = logging.getLogger(__name__)

FORMAT = 1
INDEX_TYPES = (*DENSE_TYPES, "bm25")
MAX_TRAINING_POINTS = 500_000


class IndexMismatch(ValueError):
    """An index folder that does not fit what it is asked to serve (encoder, corpus, contents)."""


def _write_json(path: Path, value: dict) -> None:
    with written_whole(path) as partial:
        partial.write_text(json.dumps(value, indent=2) + "\n")


def _same_build(plan: dict, previous: dict) -> str | None:
    """Why a folder's earlier plan is not this build, or None."""
    if previous.get("format") != FORMAT:
        return f"it has format {previous.get('format')}, this version writes {FORMAT}"
    if previous["corpus"]["checksum"] != plan["corpus"]["checksum"]:
        return f"it was built from corpus {previous['corpus']['source']} with other contents"
    if plan["corpus"]["checksum"] is None and previous["corpus"]["source"] != plan["corpus"]["source"]:
        return f"it was built from {previous['corpus']['source']}"  # hub datasets have no local bytes to hash
    if previous["encoder"] and plan["encoder"] and previous["encoder"] != plan["encoder"]:
        return f"it was encoded with {previous['encoder']}, not {plan['encoder']}"
    if previous.get("encoder_checksum") and plan["encoder_checksum"] not in (None, previous["encoder_checksum"]):
        return f"its encoder folder {plan['encoder']} has changed since (sha1 {previous['encoder_checksum']:.12})"
    if previous["shard_size"] != plan["shard_size"]:
        return f"its embedding shards hold {previous['shard_size']} rows, not {plan['shard_size']}"
    return None


def _kept_dtype(out: Path, asked: str, resolved: str | None, started: str | None) -> str | None:
    """The dtype a continued build encodes in: the one its kept embeddings were encoded in (``auto`` takes it),
    so that no index mixes the vectors of two dtypes; another one asked for by name is refused."""
    if resolved is None or started is None or not any((out / "embeddings").glob("*.npy")):
        return resolved
    if asked != "auto" and resolved != started:
        raise IndexMismatch(
            f"{out} holds embeddings encoded in {started}, and --dtype {asked} would add {resolved} ones to them: "
            f"continue with --dtype {started} (or auto), or use another --out"
        )
    if resolved != started:
        logger.info("continuing %s in %s, the dtype its kept embeddings were encoded in", out, started)
    return started


def _check_out(out: Path) -> None:
    """``out`` is new, empty or a build of ours (its ``build.json``, written before anything else): a build
    writes into it and replaces the parts it builds (``bm25/``), so it must not be a folder of other files."""
    if out.exists() and not out.is_dir():
        raise IndexMismatch(f"--out {out} is a file: give a new or empty folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        plan = json.loads((out / "build.json").read_text())
    except (OSError, ValueError):
        plan = None
    if not isinstance(plan, dict) or "format" not in plan:
        raise IndexMismatch(f"--out {out} is not empty and holds no index build: give a new or empty folder")


def build_index(
    corpus: str | Path,
    out: str | Path,
    index_types: Sequence[str] = ("flat",),
    encoder: str | None = None,
    *,
    batch_size: int = 32,
    device: str | None = None,
    dtype: str = "auto",
    shard_size: int = 10_000,
    progress: bool = True,
) -> dict:
    """Build (or continue building) the index types in ``out``; returns the manifest."""
    for name, value in (("shard_size", shard_size), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
    unknown = sorted(set(index_types) - set(INDEX_TYPES))
    if unknown or not index_types:
        raise ValueError(f"unknown index type(s) {unknown or '(none)'}: expected some of {', '.join(INDEX_TYPES)}")
    out = Path(out)
    _check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    dense_types = [t for t in index_types if t in DENSE_TYPES]
    plan = {
        "format": FORMAT,
        "corpus": corpus_fingerprint(corpus),
        "encoder": canonical_name(encoder) if dense_types else None,
        "shard_size": shard_size,
    }
    plan["encoder_checksum"] = encoder_checksum(plan["encoder"]) if dense_types else None
    plan["encoder_dtype"] = resolve_dtype(dtype, device) if dense_types else None
    if (out / "build.json").exists() and (out / "passages.arrow").exists():  # else nothing of it was kept
        previous = json.loads((out / "build.json").read_text())
        problem = _same_build(plan, previous)
        if problem:
            raise IndexMismatch(f"{out} already holds another index ({problem}); use another --out or delete it")
        plan["encoder"] = plan["encoder"] or previous["encoder"]
        plan["encoder_checksum"] = plan["encoder_checksum"] or previous.get("encoder_checksum")
        plan["encoder_dtype"] = _kept_dtype(out, dtype, plan["encoder_dtype"], previous.get("encoder_dtype"))
    _write_json(out / "build.json", plan)

    store_path = out / "passages.arrow"
    if store_path.exists():
        store = PassageStore(store_path)
    else:
        logger.info("writing the passage store %s", store_path)
        store = PassageStore.write(iter_corpus(corpus), store_path)
    if len(store) == 0:
        store_path.unlink()  # kept, it would make the rerun on a fixed corpus "another index"
        raise CorpusError(f"corpus {corpus} has no passages")

    params: dict[str, dict] = {}
    dimension = encoder_dtype = None
    if dense_types:
        embedder = load_encoder(plan["encoder"], device, batch_size, plan["encoder_dtype"])
        dimension = embedder.dimension
        encoder_dtype = embedder.dtype
        shards = embed_shards(store, embedder, out / "embeddings", shard_size, progress)
        for kind in dense_types:
            path = out / f"{kind}.faiss"
            if path.exists():
                index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)
            else:
                index = build_faiss(kind, shards, len(store), dimension)
                with written_whole(path) as partial:
                    faiss.write_index(index, str(partial))
            params[kind] = _faiss_params(index)
    if "bm25" in index_types and not (out / "bm25" / "params.index.json").exists():
        with written_whole(out / "bm25") as partial:
            BM25Retriever(store, cache=partial)

    manifest = read_manifest(out) if (out / "manifest.json").exists() else {}
    manifest = {
        "format": FORMAT,
        "index_types": sorted(set(manifest.get("index_types", [])) | set(index_types)),
        "encoder": plan["encoder"],
        "encoder_checksum": plan["encoder_checksum"],
        "dimension": dimension or manifest.get("dimension"),
        "encoder_dtype": encoder_dtype or manifest.get("encoder_dtype"),
        "count": len(store),
        "corpus": plan["corpus"],
        "params": {**manifest.get("params", {}), **params},
    }
    _write_json(out / "manifest.json", manifest)
    return manifest


def embed_shards(store: PassageStore, encoder: Encoder, folder: Path, shard_size: int, progress: bool) -> list[Path]:
    """Encode the store into ``.npy`` shards of ``shard_size`` rows; shards already on disk are kept."""
    folder.mkdir(exist_ok=True)
    count = len(store)
    paths = [folder / f"{i:05d}.npy" for i in range(math.ceil(count / shard_size))]

    def complete(i: int) -> bool:
        if not paths[i].exists():
            return False
        shape = np.load(paths[i], mmap_mode="r").shape
        return shape == (min(shard_size, count - i * shard_size), encoder.dimension)

    done = [complete(i) for i in range(len(paths))]
    initial = sum(min(shard_size, count - i * shard_size) for i, d in enumerate(done) if d)
    with tqdm(total=count, initial=initial, unit="passage", desc="encoding", disable=not progress) as bar:
        for i, path in enumerate(paths):
            if done[i]:
                continue
            parts = []
            for texts in store.iter_contents(i * shard_size, (i + 1) * shard_size, batch_size=encoder.batch_size * 4):
                parts.append(encoder.encode_passages(texts))
                bar.update(len(texts))
            with written_whole(path) as partial, partial.open("wb") as f:
                np.save(f, np.concatenate(parts))
    return paths


def build_faiss(kind: str, shards: Sequence[Path], count: int, dimension: int) -> faiss.Index:
    """A FAISS index of ``kind`` filled shard by shard (IVF-PQ trained first on a strided sample)."""
    index = new_index(kind, dimension, count)
    if not index.is_trained:
        index.train(_training_sample(shards, count, MAX_TRAINING_POINTS))
    for path in tqdm(shards, desc=f"adding to {kind}", unit="shard", disable=len(shards) < 2):
        index.add(np.load(path))
    return index


def _training_sample(shards: Sequence[Path], count: int, limit: int) -> np.ndarray:
    stride = max(1, math.ceil(count / limit))
    return np.concatenate([np.load(path, mmap_mode="r")[::stride] for path in shards]).astype(np.float32)


def _faiss_params(index: faiss.Index) -> dict:
    params: dict = {"ntotal": int(index.ntotal)}
    if isinstance(index, faiss.IndexIVFPQ):
        params |= {"nlist": int(index.nlist), "m": int(index.pq.M), "nbits": int(index.pq.nbits)}
    if isinstance(index, faiss.IndexHNSWFlat):
        params |= {"M": int(index.hnsw.nb_neighbors(1)), "efConstruction": int(index.hnsw.efConstruction)}
    return params


def read_manifest(folder: str | Path) -> dict:
    """An index folder's manifest, or a clear error when the folder is not a finished index."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        hint = " (a build was started: rerun the same `ps-agent index build` to finish it)"
        raise IndexMismatch(
            f"{folder} is not a built index: no manifest.json{hint if (Path(folder) / 'build.json').exists() else ''}; "
            "build one with `ps-agent index build --corpus FILE --index flat --out DIR`"
        )
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise IndexMismatch(f"{folder}: manifest.json is not JSON ({exc}); rebuild the index") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise IndexMismatch(f"{folder}: index format {found}, this version reads {FORMAT}; rebuild it")
    types = manifest.get("index_types")
    if not isinstance(types, list) or not types or any(t not in INDEX_TYPES for t in types):  # names files read
        raise IndexMismatch(
            f"{folder}: manifest index_types {types!r:.80}: expected a non-empty list of {', '.join(INDEX_TYPES)}"
        )
    missing = [key for key in ("count", "corpus", "encoder", "dimension") if key not in manifest]
    if missing or not isinstance(manifest["count"], int):
        raise IndexMismatch(f"{folder}: manifest.json lacks {missing or 'an integer count'}; rebuild the index")
    return manifest


def _check_corpus(manifest: dict, corpus: str | Path | None) -> None:
    recorded = manifest["corpus"]
    if corpus is None:
        source = recorded["source"]
        local = source == "embedded" or Path(source).is_file()
        if not recorded["checksum"] or not local:
            return  # built from a hub dataset or a file no longer there: the store is self-contained
        if source != "embedded" and _unchanged(Path(source), recorded):
            return
        corpus = source
    current = corpus_fingerprint(corpus)
    if current["checksum"] != recorded["checksum"]:
        raise IndexMismatch(
            f"the corpus changed since this index was built: {current['source']} has sha1 {current['checksum']}, "
            f"the index was built from sha1 {recorded['checksum']}; rebuild it with `ps-agent index build`"
        )


def _unchanged(path: Path, recorded: dict) -> bool:
    """Same size and modification time as at build time: no need to hash a large corpus again."""
    stat = path.stat()
    return stat.st_size == recorded.get("bytes") and stat.st_mtime_ns == recorded.get("mtime_ns")


def default_kind(manifest: dict) -> str:
    """What a folder serves unless told: its one index, or hybrid when it holds a dense index and BM25."""
    types = manifest["index_types"]
    dense = [t for t in types if t in DENSE_TYPES]
    return "hybrid" if dense and "bm25" in types else types[0]


def load_index(
    folder: str | Path,
    kind: str | None = None,
    *,
    encoder: str | None = None,
    corpus: str | Path | None = None,
    check_corpus: bool = True,
    device: str | None = None,
    dtype: str = "auto",
    batch_size: int = 32,
    nprobe: int = 32,
    ef_search: int = 64,
) -> Retriever:
    """A retriever over a built folder; refuses another encoder, a changed corpus or a damaged folder."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    kind = kind or default_kind(manifest)
    dense_types = [t for t in manifest["index_types"] if t in DENSE_TYPES]
    available = manifest["index_types"] + (["hybrid"] if dense_types and "bm25" in manifest["index_types"] else [])
    if kind not in available:
        raise IndexMismatch(f"{folder} has no {kind!r} index: it holds {', '.join(available)}")
    if encoder is not None and dense_types and canonical_name(encoder) != manifest["encoder"]:
        raise IndexMismatch(
            f"{folder} was built with encoder {manifest['encoder']} ({manifest['dimension']}-d), "
            f"not {canonical_name(encoder)}: queries must be encoded by the model that encoded the passages"
        )
    if check_corpus or corpus is not None:
        _check_corpus(manifest, corpus)
    store = PassageStore(folder / "passages.arrow")
    if len(store) != manifest["count"]:
        raise IndexMismatch(f"{folder}: passages.arrow holds {len(store)} passages, the manifest {manifest['count']}")

    def dense(kind: str) -> DenseRetriever:
        embedder = load_encoder(manifest["encoder"], device, batch_size, dtype)
        recorded = manifest.get("encoder_checksum")  # absent from manifests written before it was recorded
        if recorded and encoder_checksum(manifest["encoder"]) not in (None, recorded):
            raise IndexMismatch(
                f"encoder folder {manifest['encoder']} has changed since {folder} was built "
                f"(sha1 {recorded:.12}): its embeddings are another model's; rebuild the index"
            )
        if embedder.dimension != manifest["dimension"]:
            raise IndexMismatch(
                f"encoder {manifest['encoder']} now gives {embedder.dimension}-d vectors; "
                f"{folder} holds {manifest['dimension']}-d ones: rebuild the index"
            )
        try:
            index = faiss.read_index(str(folder / f"{kind}.faiss"))
        except RuntimeError as exc:  # faiss's own error for a missing or truncated file
            raise IndexMismatch(f"{folder}/{kind}.faiss cannot be read ({str(exc)[:160]}); rebuild the index") from exc
        if index.ntotal != len(store):
            raise IndexMismatch(f"{folder}/{kind}.faiss holds {index.ntotal} vectors for {len(store)} passages")
        return DenseRetriever(on_gpu_if_present(index, kind), embedder, store, nprobe=nprobe, ef_search=ef_search)

    if kind == "bm25":
        return BM25Retriever(store, cache=folder / "bm25")
    if kind == "hybrid":
        return HybridRetriever([BM25Retriever(store, cache=folder / "bm25"), dense(dense_types[0])])
    return dense(kind)
