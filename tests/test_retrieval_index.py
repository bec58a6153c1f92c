"""Index folders over real text: streamed corpora, the Arrow passage store, the real MiniLM encoder,
real FAISS (Flat, HNSW, IVF-PQ) and bm25s indexes, hybrid fusion, resuming, and manifest checks."""

import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ps_agent.cache import file_checksum
from ps_agent.retrieval import Passage, resolve_retriever
from ps_agent.retrieval.corpus import CorpusError, load_embedded_corpus
from ps_agent.retrieval.dense import (
    DenseRetriever,
    HybridRetriever,
    ivfpq_shape,
    on_gpu_if_present,
    reciprocal_rank_fusion,
)
from ps_agent.retrieval.encoders import MINILM, embedded_encoder_path, load_encoder, prefixes_for
from ps_agent.retrieval.index import IndexMismatch, build_index, load_index, read_manifest
from ps_agent.retrieval.store import PassageStore, iter_corpus

PS_AGENT = str(Path(sys.executable).parent / "ps-agent")
N = 150  # passages of the embedded corpus used here


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return load_embedded_corpus()[:N]


def write_corpus(path: Path, passages: list[Passage]) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages))
    return path


@pytest.fixture(scope="module")
def corpus(passages, tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", passages)


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index") / "all"
    build_index(corpus, out, ["flat", "hnsw", "ivfpq", "bm25"], progress=False, shard_size=64)
    return out


def search(retriever, queries, k):
    return asyncio.run(retriever.asearch(queries, k))


def test_every_corpus_form_streams_the_same_passages(passages, corpus, tmp_path):
    import datasets

    columns = {"id": [p.id for p in passages], "title": [p.title for p in passages], "text": [p.text for p in passages]}
    pq.write_table(pa.table(columns), tmp_path / "corpus.parquet")
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "hf"))
    expected = [(p.id, p.contents) for p in passages]
    for source in (corpus, tmp_path / "corpus.parquet", tmp_path / "hf"):
        batches = list(iter_corpus(source, batch_size=40))
        assert max(b.num_rows for b in batches) <= 40, source
        rows = [(r["id"], r["contents"]) for b in batches for r in b.to_pylist()]
        assert rows == expected, source


def test_the_passage_store_fetches_rows_across_batches(corpus, passages, tmp_path):
    store = PassageStore.write(iter_corpus(corpus, batch_size=40), tmp_path / "passages.arrow")
    reopened = PassageStore(tmp_path / "passages.arrow")
    assert len(reopened) == N
    assert reopened[0] == passages[0] and reopened[N - 1] == passages[N - 1]
    assert [p.id for p in store.take([39, 40, 121], [0.5, 0.4, 0.3])] == [passages[i].id for i in (39, 40, 121)]
    assert store.take([40], [0.25])[0].score == 0.25
    assert [t for chunk in store.iter_contents(30, 95, batch_size=25) for t in chunk] == [
        p.contents for p in passages[30:95]
    ]
    with pytest.raises(IndexError, match="out of range"):
        store[N]


def test_bad_corpora_say_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "\\"A\\"\\ntext"}\n{"id": "2"}\nnot json\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: bad corpus line .*no 'contents'"):
        list(iter_corpus(bad))
    pq.write_table(pa.table({"id": ["1"], "body": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(CorpusError, match="expected 'contents'"):
        list(iter_corpus(tmp_path / "bad.parquet"))
    with pytest.raises(CorpusError, match="corpus not found"):
        list(iter_corpus(tmp_path / "missing.jsonl"))
    for empty in ("hf:", "hf::train"):  # an IndexError traceback
        with pytest.raises(CorpusError, match=f"corpus '{empty}' names no dataset: expected hf:NAME"):
            list(iter_corpus(empty))


def test_e5_models_get_their_prefixes_and_embeddings_are_normalised():
    assert prefixes_for("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert prefixes_for("/models/multilingual_e5_large") == ("query: ", "passage: ")
    assert prefixes_for(MINILM) == ("", "") and prefixes_for("BAAI/bge-base-en-v1.5") == ("", "")
    encoder = load_encoder("minilm")
    assert encoder.name == MINILM and encoder.dimension == 384
    prefixed = load_encoder("minilm")
    prefixed.query_prefix = "query: "
    plain = encoder.encode_passages(["query: who built it"])  # MiniLM has no passage prefix
    assert abs(prefixed.encode_queries(["who built it"]) - plain).max() < 1e-6
    assert abs(prefixed.encode_queries(["who built it"]) - encoder.encode_queries(["who built it"])).max() > 1e-3
    vectors = encoder.encode_passages(["one passage", "another passage"])
    assert vectors.dtype.name == "float32" and abs((vectors**2).sum(axis=1) - 1).max() < 1e-5
    exact = load_encoder("minilm", dtype="float32")
    assert exact.dtype == "float32" and (exact.encode_passages(["one passage"]) * vectors[:1]).sum() > 0.99
    with pytest.raises(ValueError, match="unknown encoder dtype 'fp8'"):
        load_encoder("minilm", dtype="fp8")


def test_ivfpq_shape_fits_the_corpus():
    assert ivfpq_shape(21_000_000, 768) == (18330, 96, 8)
    for count in (5, 150, 10_000):
        nlist, m, nbits = ivfpq_shape(count, 384)
        assert 1 <= nlist <= max(1, count // 39) and 384 % m == 0 and 2**nbits <= max(2, count // 39)


def test_every_index_type_finds_passages_by_their_title(built, passages):
    titles = [p.title for p in passages[:30]]
    expected = [p.id for p in passages[:30]]

    def hit_rate(kind, k):
        results = search(load_index(built, kind), titles, k)
        assert all(len(r) == k or kind == "bm25" for r in results)
        return sum(want in [p.id for p in got] for want, got in zip(expected, results, strict=True)) / len(titles)

    assert hit_rate("flat", 1) >= 0.8
    assert hit_rate("hnsw", 1) == hit_rate("flat", 1)
    assert hit_rate("ivfpq", 10) >= 0.5  # compressed codes: approximate by design
    assert hit_rate("bm25", 3) >= 0.8
    assert hit_rate("hybrid", 3) >= hit_rate("flat", 3) - 0.1
    flat = load_index(built, "flat")
    assert isinstance(flat, DenseRetriever) and all(p.score is not None for p in search(flat, titles[:2], 3)[0])
    assert isinstance(load_index(built), HybridRetriever)  # dense + BM25 in one folder: hybrid by default
    bm25 = load_index(built, "bm25")  # built from the passage store, with its title field beside the passage
    assert (built / "bm25" / "titles" / "params.index.json").is_file() and bm25.titles is not None
    assert bm25.titles.scores["num_docs"] == N


def test_reciprocal_rank_fusion_rewards_agreement():
    a, b, c = (Passage(i, i, "") for i in "abc")
    fused = reciprocal_rank_fusion([[a, b, c], [b, c, a], [b, a]], k=2, rrf_k=60)
    assert [p.id for p in fused] == ["b", "a"] and fused[0].score == pytest.approx(1 / 62 + 2 / 61)


def test_two_passages_that_share_an_id_stay_two_in_the_fusion():
    """A corpus with a repeated id lost one of the two passages, and the other took its ranks."""
    tokyo, paris, rome = Passage("7", "Tokyo", "t"), Passage("7", "Paris", "p"), Passage("8", "Rome", "r")
    fused = reciprocal_rank_fusion([[tokyo, paris, rome], [tokyo, rome, paris]], k=3, rrf_k=60)
    assert fused[0].title == "Tokyo" and fused[0].score == pytest.approx(2 / 61)
    assert sorted(p.title for p in fused[1:]) == ["Paris", "Rome"]  # each with its own ranks: 1/62 + 1/63


def test_the_manifest_records_the_build(built, corpus):
    manifest = read_manifest(built)
    assert manifest["index_types"] == ["bm25", "flat", "hnsw", "ivfpq"]
    assert (manifest["encoder"], manifest["dimension"], manifest["count"]) == (MINILM, 384, N)
    assert manifest["corpus"]["checksum"] == file_checksum(corpus)
    assert manifest["params"]["ivfpq"]["ntotal"] == N and manifest["params"]["hnsw"]["M"] == 32
    assert sorted(p.name for p in (built / "embeddings").iterdir()) == ["00000.npy", "00001.npy", "00002.npy"]


def test_loading_refuses_another_encoder_a_changed_corpus_or_an_unbuilt_folder(built, corpus, tmp_path):
    with pytest.raises(
        IndexMismatch, match=r"built with encoder sentence-transformers/all-MiniLM-L6-v2 .*not intfloat"
    ):
        load_index(built, "flat", encoder="intfloat/e5-base-v2")
    with pytest.raises(IndexMismatch, match="has no 'nope' index: it holds bm25, flat, hnsw, ivfpq, hybrid"):
        load_index(built, "nope")
    changed = tmp_path / "corpus.jsonl"
    shutil.copy(corpus, changed)
    folder = tmp_path / "bm25"
    build_index(changed, folder, ["bm25"], progress=False)
    assert search(load_index(folder), ["Paris"], 1)
    with changed.open("a") as f:
        f.write(json.dumps({"id": "new", "contents": '"New"\nA passage added after the build.'}) + "\n")
    with pytest.raises(IndexMismatch, match="the corpus changed since this index was built"):
        load_index(folder)
    with pytest.raises(IndexMismatch, match="the corpus changed"):
        load_index(built, "bm25", corpus=changed)
    assert search(load_index(folder, check_corpus=False), ["Paris"], 1)  # the store is self-contained
    with pytest.raises(IndexMismatch, match=r"already holds another index .*other contents"):
        build_index(changed, folder, ["bm25"], progress=False)
    with pytest.raises(IndexMismatch, match=r"no manifest\.json"):
        load_index(tmp_path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: m | {"index_types": []}, r"manifest index_types \[\]: expected a non-empty list"),
        (lambda m: m | {"index_types": ["../elsewhere/flat"]}, r"index_types \['\.\./elsewhere/flat'\]"),  # a path
        (lambda m: {k: v for k, v in m.items() if k != "count"}, r"manifest\.json lacks \['count'\]"),
        (None, r"flat\.faiss cannot be read \(.*\); rebuild the index"),
    ],
)
def test_a_damaged_index_folder_is_refused_with_the_reason(built, tmp_path, damage, message):
    """These raised faiss's RuntimeError, a KeyError or an IndexError (a traceback from the CLI), and an index type
    was a file name: a manifest naming "../elsewhere/flat" loaded an index from outside the folder."""
    folder = tmp_path / "copy"
    shutil.copytree(built, folder)
    if damage is None:
        (folder / "flat.faiss").write_bytes((folder / "flat.faiss").read_bytes()[:100])  # a copy cut short
    else:
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps(damage(manifest)))
    with pytest.raises(IndexMismatch, match=message):
        load_index(folder, "flat", check_corpus=False)


def test_an_encoder_folder_retrained_in_place_is_not_served_with_its_old_embeddings(corpus, tmp_path):
    """The manifest knew the encoder only by its path: after the folder was retrained, queries were encoded by
    the new model against passages the old one embedded, and a continued build reused the old shards."""
    from safetensors.torch import load_file, save_file

    encoder = tmp_path / "encoder"
    shutil.copytree(embedded_encoder_path(), encoder)
    out = tmp_path / "index"
    build_index(corpus, out, ["flat"], encoder=str(encoder), progress=False, shard_size=64)
    assert len(search(load_index(out, "flat"), ["Paris"], 2)[0]) == 2  # unchanged: served
    weights = load_file(encoder / "model.safetensors")
    weights = {name: tensor * 1.01 if name.endswith("weight") else tensor for name, tensor in weights.items()}
    save_file(weights, encoder / "model.safetensors", metadata={"format": "pt"})  # "retrained" in place
    with pytest.raises(IndexMismatch, match=r"encoder folder .*encoder has changed since .* rebuild the index"):
        load_index(out, "flat")
    (out / "manifest.json").unlink()  # a build stopped before its manifest, continued after the retrain
    with pytest.raises(IndexMismatch, match=r"already holds another index \(its encoder folder .* has changed"):
        build_index(corpus, out, ["flat"], encoder=str(encoder), progress=False, shard_size=64)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"shard_size": -5}, "shard_size must be an integer of at least 1, got -5"),  # built an empty index
        ({"shard_size": 0}, "shard_size must be an integer of at least 1, got 0"),  # ZeroDivisionError
        ({"batch_size": 0}, "batch_size must be an integer of at least 1, got 0"),
        ({"device": "tpu"}, "unknown encoder device 'tpu': expected cpu, cuda or cuda:N"),  # torch's RuntimeError
    ],
)
def test_bad_build_options_are_refused_before_anything_is_written(corpus, tmp_path, option, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_index(corpus, tmp_path / "out", ["flat"], progress=False, **option)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_folder_of_other_files_is_refused_as_out_and_keeps_them(corpus, tmp_path):
    """The build wrote its build.json over the folder's and replaced its bm25/ (notes.txt was deleted)."""
    out = tmp_path / "project"
    (out / "bm25").mkdir(parents=True)
    (out / "bm25" / "notes.txt").write_text("mine")
    (out / "build.json").write_text('["my own file"]')
    with pytest.raises(IndexMismatch, match="is not empty and holds no index build: give a new or empty folder"):
        build_index(corpus, out, ["bm25"], progress=False)
    assert (out / "bm25" / "notes.txt").read_text() == "mine" and (out / "build.json").read_text() == '["my own file"]'
    (tmp_path / "file").write_text("x")
    with pytest.raises(IndexMismatch, match="is a file"):
        build_index(corpus, tmp_path / "file", ["bm25"], progress=False)


def test_a_build_that_failed_before_keeping_anything_is_started_again_on_a_fixed_corpus(corpus, tmp_path):
    bad = tmp_path / "corpus.jsonl"
    bad.write_text(corpus.read_text() + '{"id": "x"}\n')
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:\d+: bad corpus line"):
        build_index(bad, tmp_path / "out", ["bm25"], progress=False)
    bad.write_text(corpus.read_text())  # fixed: was refused as "already holds another index"
    assert build_index(bad, tmp_path / "out", ["bm25"], progress=False)["count"] == N
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CorpusError, match=r"empty\.jsonl has no passages"):
        build_index(empty, tmp_path / "out-2", ["bm25"], progress=False)
    empty.write_text(corpus.read_text())  # filled: an empty store was kept, and the rerun refused as another index
    assert build_index(empty, tmp_path / "out-2", ["bm25"], progress=False)["count"] == N


def test_an_interrupted_build_continues_where_it_stopped(corpus, built, tmp_path):
    out = tmp_path / "resumed"
    command = [PS_AGENT, "index", "build", "--corpus", str(corpus), "--out", str(out), "--shard-size", "16"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list((out / "embeddings").glob("0*.npy"))) < 2 and time.monotonic() < deadline:
        assert process.poll() is None, "the build ended before it could be interrupted"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "embeddings").glob("0*.npy")}
    assert 2 <= len(kept) < 10 and not (out / "manifest.json").exists()
    with pytest.raises(IndexMismatch, match="a build was started: rerun"):
        load_index(out)

    build_index(corpus, out, ["flat"], progress=False, shard_size=16)
    assert all((out / "embeddings" / name).stat().st_mtime_ns == mtime for name, mtime in kept.items())
    assert len(list((out / "embeddings").glob("0*.npy"))) == 10  # ceil(150 / 16)
    queries = [p.title for p in load_embedded_corpus()[:10]]
    resumed = [[p.id for p in r] for r in search(load_index(out), queries, 3)]
    fresh = [[p.id for p in r] for r in search(load_index(built, "flat"), queries, 3)]
    assert resumed == fresh


@pytest.mark.parametrize("started", ["float32", "bfloat16"])  # on any CPU, one of them is not what auto picks
def test_a_continued_build_encodes_in_the_dtype_it_started_in_and_refuses_another_by_name(passages, tmp_path, started):
    corpus = write_corpus(tmp_path / "corpus.jsonl", passages[:40])  # 3 shards: a CPU without native bf16 is slow
    out = tmp_path / "index"
    build_index(corpus, out, ["flat"], progress=False, shard_size=16, dtype=started)
    first = np.load(out / "embeddings" / "00002.npy")
    for path in (out / "embeddings" / "00002.npy", out / "flat.faiss", out / "manifest.json"):
        path.unlink()  # as a build killed while encoding its last shard leaves it
    other = "bfloat16" if started == "float32" else "float32"
    with pytest.raises(IndexMismatch, match=f"encoded in {started}.*--dtype {other}.*continue with --dtype {started}"):
        build_index(corpus, out, ["flat"], progress=False, shard_size=16, dtype=other)

    manifest = build_index(corpus, out, ["flat"], progress=False, shard_size=16, dtype="auto")
    assert manifest["encoder_dtype"] == started
    np.testing.assert_allclose(np.load(out / "embeddings" / "00002.npy"), first, atol=1e-6)


def test_index_folders_resolve_as_retrievers_and_move_to_a_gpu_only_when_faiss_sees_one(built, passages):
    from ps_agent.retrieval.langchain import PassageRetriever

    retriever = resolve_retriever(built)
    assert retriever is resolve_retriever(str(built))  # loaded once
    assert search(retriever, ["Paris"], 2)[0]
    hnsw = load_index(built, "hnsw")
    as_langchain = PassageRetriever(retriever=hnsw, k=2)  # a LangChain BaseRetriever
    docs = as_langchain.invoke(passages[3].title)
    assert len(docs) == 2 and docs[0].id == passages[3].id and docs[0].metadata["title"] == passages[3].title
    assert on_gpu_if_present(hnsw.index, "hnsw") is hnsw.index  # HNSW has no GPU version: the CPU index itself
    flat = load_index(built, "flat")
    gpus = faiss.get_num_gpus() if hasattr(faiss, "index_cpu_to_all_gpus") else 0  # faiss-cpu has no GPU API
    moved = on_gpu_if_present(flat.index, "flat")
    assert (moved is flat.index) == (gpus == 0)  # the CPU index itself unless faiss-gpu sees a GPU


def test_index_build_cli(corpus, tmp_path):
    out = tmp_path / "cli"
    done = subprocess.run(
        [PS_AGENT, "index", "build", "--corpus", str(corpus), "--out", str(out), "--index", "bm25"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"built bm25 over {N} passages" in done.stdout
    info = subprocess.run([PS_AGENT, "index", "info", str(out)], capture_output=True, text=True)
    assert json.loads(info.stdout)["count"] == N
    bad = subprocess.run(
        [PS_AGENT, "index", "build", "--corpus", str(corpus), "--out", str(out), "--index", "annoy"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "expected some of flat, hnsw, ivfpq, bm25" in bad.stderr


def test_a_settled_file_is_checksummed_once_and_a_fresh_rewrite_is_read_again(tmp_path, monkeypatch):
    from ps_agent import cache

    reads = []
    sha1 = cache._sha1
    monkeypatch.setattr(cache, "_sha1", lambda path: reads.append(path) or sha1(path))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    an_hour_ago = time.time() - 3600
    os.utime(weights, (an_hour_ago, an_hour_ago))
    first = file_checksum(weights)
    assert file_checksum(tmp_path / "." / "model.safetensors") == first and len(reads) == 1  # one read, any spelling

    weights.write_bytes(b"b" * 1000)  # same size, modified just now
    assert file_checksum(weights) != first and len(reads) == 2
    assert file_checksum(weights) == hashlib.sha1(b"b" * 1000).hexdigest() and len(reads) == 3  # not settled yet
