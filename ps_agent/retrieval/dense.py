"""Dense retrieval with FAISS (Flat, HNSW, IVF-PQ; inner product), and hybrid rank fusion.

faiss-cpu by default; when faiss-gpu is installed and a GPU is visible, Flat and IVF-PQ indexes are
searched on the GPU(s) (HNSW has no GPU version and stays on the CPU).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

import faiss

from ps_agent.retrieval.base import Passage, Retriever
from ps_agent.retrieval.encoders import Encoder
from ps_agent.retrieval.store import PassageStore

logger = logging.getLogger(__name__)

DENSE_TYPES = ("flat", "hnsw", "ivfpq")


def ivfpq_shape(count: int, dimension: int) -> tuple[int, int, int]:
    """``(nlist, m, nbits)`` for IVF-PQ over ``count`` vectors: ~4·√n lists (each trained on ≥ 39
    points), ``m`` sub-quantisers of 8 dimensions (48 for 384-d, 96 for 768-d), ≤ 8 bits per code."""
    nlist = max(1, min(int(4 * math.sqrt(count)), count // 39))
    m = next(m for m in range(max(1, dimension // 8), 0, -1) if dimension % m == 0)
    nbits = max(1, min(8, int(math.log2(max(2, count // 39)))))
    return nlist, m, nbits


def new_index(kind: str, dimension: int, count: int, hnsw_m: int = 32) -> faiss.Index:
    """An empty FAISS index of ``kind`` for ``count`` vectors, inner-product metric."""
    if kind == "flat":
        return faiss.IndexFlatIP(dimension)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dimension, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        return index
    if kind == "ivfpq":
        nlist, m, nbits = ivfpq_shape(count, dimension)
        return faiss.IndexIVFPQ(faiss.IndexFlatIP(dimension), dimension, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    raise ValueError(f"unknown dense index type {kind!r}: expected one of {', '.join(DENSE_TYPES)}")


def on_gpu_if_present(index: faiss.Index, kind: str) -> faiss.Index:
    """The index moved to every visible GPU when faiss-gpu is installed (not HNSW); else unchanged."""
    if kind == "hnsw" or not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        return index
    logger.info("searching the %s index on %d GPU(s)", kind, faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index)


class DenseRetriever:
    """Encode queries, search a FAISS index, fetch the passages from the on-disk store."""

    def __init__(
        self, index: faiss.Index, encoder: Encoder, store: PassageStore, nprobe: int = 32, ef_search: int = 64
    ) -> None:
        self.index = index
        self.encoder = encoder
        self.store = store
        if hasattr(index, "nprobe"):
            index.nprobe = nprobe
        if hasattr(index, "hnsw"):
            index.hnsw.efSearch = ef_search

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages per query; one encoder batch and one index search for all of them."""
        vectors = self.encoder.encode_queries(list(queries))
        scores, rows = self.index.search(vectors, min(k, len(self.store)))
        return [
            self.store.take([r for r in row if r >= 0], [s for s, r in zip(srow, row, strict=True) if r >= 0])
            for srow, row in zip(scores.tolist(), rows.tolist(), strict=True)
        ]

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return await asyncio.to_thread(self.search, queries, k)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Passage]], k: int, rrf_k: int = 60) -> list[Passage]:
    """Fuse ranked lists by reciprocal rank (Cormack et al. 2009): score = Σ 1/(rrf_k + rank)."""
    fused: dict[tuple[str, str, str], float] = {}  # a passage is its id and its text: two sharing an id stay two
    for ranking in rankings:
        for rank, passage in enumerate(ranking, 1):
            key = (passage.id, passage.title, passage.text)
            fused[key] = fused.get(key, 0.0) + 1.0 / (rrf_k + rank)
    order = sorted(fused, key=lambda key: -fused[key])[:k]
    return [Passage(pid, title, text, fused[pid, title, text]) for pid, title, text in order]


class HybridRetriever:
    """Several retrievers (e.g. BM25 and dense) searched concurrently, fused by reciprocal rank."""

    def __init__(self, retrievers: Sequence[Retriever], depth: int = 20, rrf_k: int = 60) -> None:
        self.retrievers = list(retrievers)
        self.depth = depth
        self.rrf_k = rrf_k

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        depth = max(k, self.depth)
        per_retriever = await asyncio.gather(*(r.asearch(queries, depth) for r in self.retrievers))
        return [
            reciprocal_rank_fusion([results[i] for results in per_retriever], k, self.rrf_k)
            for i in range(len(queries))
        ]
