"""Corpora read as a stream of batches, and the on-disk passage store they are written to.

A corpus is never held as a Python list: ``iter_corpus`` yields Arrow record batches of
``(id, contents)`` from a Search-R1/FlashRAG jsonl file, a parquet file, a ``datasets`` folder
(``save_to_disk``), a Hugging Face dataset (``hf:NAME[:SPLIT]``, streamed) or the embedded corpus,
and ``PassageStore`` memory-maps the Arrow IPC file they are written to and fetches passages by row.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ps_agent.cache import file_checksum, folder_checksum, written_whole
from ps_agent.retrieval.base import Passage
from ps_agent.retrieval.corpus import CorpusError, embedded_corpus_path, load_embedded_corpus
from ps_agent.text import lone_surrogates

SCHEMA = pa.schema([("id", pa.string()), ("contents", pa.string())])
EMBEDDED = "embedded"


def _batch(ids: list[str], contents: list[str]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.string()), pa.array(contents, pa.string())], schema=SCHEMA)


def _is_id(value: object) -> bool:
    """Whether a corpus row's id is one: a string or an integer (``null`` was read as the id "None")."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _normalise(columns: dict[str, list], where: str, first_row: int) -> pa.RecordBatch:
    """``(id, contents)`` from a batch of columns: ``contents``, or ``title`` + ``text``, or ``text``."""
    if "contents" in columns:
        contents = columns["contents"]
    elif "title" in columns and "text" in columns:
        contents = [
            f'"{t}"\n{x}' if isinstance(t, str) and isinstance(x, str) else None  # None: refused below, by row
            for t, x in zip(columns["title"], columns["text"], strict=True)
        ]
    elif "text" in columns:
        contents = columns["text"]
    else:
        raise CorpusError(
            f"{where}: no passage text in columns {sorted(columns)}; expected 'contents' (\"Title\"\\ntext), "
            "or 'title' and 'text', or 'text'"
        )
    ids = columns.get("id") or [str(first_row + i) for i in range(len(contents))]
    for i, value in enumerate(contents):
        if not isinstance(value, str) or not value.strip():
            raise CorpusError(f"{where}: row {first_row + i} has no text ({value!r}); expected a non-empty string")
    for i, value in enumerate(ids):
        if not _is_id(value):
            raise CorpusError(f"{where}: row {first_row + i} has id {value!r:.40}; expected a string or an integer")
    return _batch([str(i) for i in ids], contents)


def _jsonl_batches(path: Path, batch_size: int) -> Iterator[pa.RecordBatch]:
    ids: list[str] = []
    contents: list[str] = []
    with path.open("rb") as lines:
        for number, data in enumerate(lines, 1):
            if not data.strip():
                continue
            try:
                row = json.loads(data.decode("utf-8"))  # per line: bad bytes are named with their line
                if "contents" in row:
                    text = row["contents"]
                elif "title" in row and "text" in row:
                    title, body = row["title"], row["text"]
                    if not (isinstance(title, str) and isinstance(body, str)):
                        raise TypeError(f"title and text must be strings, got {title!r:.40} and {body!r:.40}")
                    text = f'"{title}"\n{body}'
                else:
                    raise KeyError("no 'contents' (nor 'title' and 'text')")
                if not isinstance(text, str) or not text.strip():
                    raise ValueError("empty contents")
                passage_id = row["id"]
                if not _is_id(passage_id):  # null became "None"
                    raise TypeError(f"id must be a string or an integer, got {passage_id!r:.40}")
                for field, value in (("contents", text), ("id", str(passage_id))):
                    if found := lone_surrogates(value):  # "\ud800" in JSON: not text any index can take
                        raise ValueError(f"{field} holds {found[0]!a} at character {found[1]} (surrogates not allowed)")
                ids.append(str(passage_id))
                contents.append(text)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise CorpusError(
                    f"{path}:{number}: bad corpus line ({type(exc).__name__}: {exc}); "
                    'expected {"id": ..., "contents": "\\"Title\\"\\ntext"}'
                ) from exc
            if len(ids) == batch_size:
                yield _batch(ids, contents)
                ids, contents = [], []
    if ids:
        yield _batch(ids, contents)


def _dataset_batches(dataset: Iterable, where: str, batch_size: int) -> Iterator[pa.RecordBatch]:
    first = 0
    for columns in dataset.iter(batch_size=batch_size):
        batch = _normalise(columns, where, first)
        first += batch.num_rows
        yield batch


def iter_corpus(source: str | Path, batch_size: int = 10_000) -> Iterator[pa.RecordBatch]:
    """Stream a corpus as ``(id, contents)`` record batches of at most ``batch_size`` rows."""
    source = str(source)
    if source == EMBEDDED:
        passages = load_embedded_corpus()  # 10k summaries in one JSON object: read whole, by necessity
        for start in range(0, len(passages), batch_size):
            chunk = passages[start : start + batch_size]
            yield _batch([p.id for p in chunk], [p.contents for p in chunk])
        return
    if source.startswith("hf:"):
        import datasets

        name, _, split = source[3:].partition(":")
        if not name.strip():
            raise CorpusError(f"corpus {source!r} names no dataset: expected hf:NAME or hf:NAME:SPLIT")
        yield from _dataset_batches(
            datasets.load_dataset(name, split=split or "train", streaming=True), source, batch_size
        )
        return
    path = Path(source)
    if path.is_dir():
        import datasets

        try:
            dataset = datasets.load_from_disk(str(path))
        except FileNotFoundError as exc:
            raise CorpusError(f"{path} is not a datasets folder (save_to_disk) ({exc})") from exc
        if isinstance(dataset, datasets.DatasetDict):
            raise CorpusError(f"{path} holds several splits {list(dataset)}; point at one split's folder")
        yield from _dataset_batches(dataset, str(path), batch_size)
        return
    if not path.is_file():
        raise CorpusError(
            f"corpus not found: {path} (expected a .jsonl or .parquet file, a datasets folder, "
            "hf:NAME[:SPLIT] or 'embedded')"
        )
    if path.suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        first = 0
        for record_batch in parquet.iter_batches(batch_size=batch_size):
            batch = _normalise(record_batch.to_pydict(), str(path), first)
            first += batch.num_rows
            yield batch
        return
    yield from _jsonl_batches(path, batch_size)


def load_jsonl_corpus(path: str | Path) -> list[Passage]:
    """Read a small Search-R1/FlashRAG corpus (``{"id", "contents": "\\"Title\\"\\ntext"}`` per line) into memory;
    ``ps-agent index build`` streams large ones into an on-disk store instead."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path} (expected a jsonl file of {{'id', 'contents'}} lines)")
    passages = [
        Passage.from_contents(pid, contents)
        for batch in iter_corpus(path)
        for pid, contents in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
    ]
    if not passages:
        raise CorpusError(f"corpus file is empty: {path}")
    return passages


def corpus_fingerprint(source: str | Path) -> dict:
    """What identifies a corpus for an index manifest: its source, size and content checksum."""
    source = str(source)
    if source == EMBEDDED:
        path = embedded_corpus_path()
        return {"source": EMBEDDED, "checksum": file_checksum(path), "bytes": path.stat().st_size}
    if source.startswith("hf:"):  # a hub dataset streamed by name has no local bytes to hash
        return {"source": source, "checksum": None, "bytes": None}
    path = Path(source).resolve()
    if path.is_dir():
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return {"source": str(path), "checksum": folder_checksum(path), "bytes": size}
    if not path.is_file():
        raise CorpusError(f"corpus not found: {path}")
    stat = path.stat()
    return {"source": str(path), "checksum": file_checksum(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


class PassageStore(Sequence[Passage]):
    """Passages by row from an Arrow IPC file, memory-mapped: opening it reads no passage text."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        reader = pa.ipc.open_file(pa.memory_map(str(self.path)))
        if reader.schema != SCHEMA:
            raise CorpusError(f"{self.path}: not a passage store (schema {reader.schema}, expected {SCHEMA})")
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self._starts = [0]
        for batch in self._batches:
            self._starts.append(self._starts[-1] + batch.num_rows)

    @staticmethod
    def write(batches: Iterable[pa.RecordBatch], path: str | Path) -> PassageStore:
        """Write streamed batches to ``path`` (whole or not at all)."""
        with (
            written_whole(path) as partial,
            pa.OSFile(str(partial), "wb") as sink,
            pa.ipc.new_file(sink, SCHEMA) as writer,
        ):
            for batch in batches:
                writer.write_batch(batch)
        return PassageStore(path)

    def __len__(self) -> int:
        return self._starts[-1]

    def _locate(self, row: int) -> tuple[pa.RecordBatch, int]:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range: the store holds {len(self)} passages")
        b = bisect.bisect_right(self._starts, row) - 1
        return self._batches[b], row - self._starts[b]

    def __getitem__(self, row: int) -> Passage:  # type: ignore[override]
        batch, i = self._locate(row)
        return Passage.from_contents(batch.column(0)[i].as_py(), batch.column(1)[i].as_py())

    def take(self, rows: Sequence[int], scores: Sequence[float] | None = None) -> list[Passage]:
        """The passages at ``rows``, with their search scores when given."""
        passages = [self[row] for row in rows]
        if scores is None:
            return passages
        return [Passage(p.id, p.title, p.text, float(s)) for p, s in zip(passages, scores, strict=True)]

    def iter_contents(self, start: int = 0, stop: int | None = None, batch_size: int = 10_000) -> Iterator[list[str]]:
        """The ``contents`` of rows ``start:stop`` in lists of at most ``batch_size`` (to encode or tokenise)."""
        stop = len(self) if stop is None else min(stop, len(self))
        for first in range(start, stop, batch_size):
            last = min(first + batch_size, stop)
            texts: list[str] = []
            row = first
            while row < last:
                batch, i = self._locate(row)
                n = min(batch.num_rows - i, last - row)
                texts += batch.column(1).slice(i, n).to_pylist()
                row += n
            yield texts
