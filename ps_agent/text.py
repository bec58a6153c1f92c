"""Checks on untrusted text shared by every input path (questions, corpora, queries)."""

from __future__ import annotations


def lone_surrogates(text: str) -> tuple[str, int] | None:
    """The first run of lone surrogates in ``text`` and the character it starts at, or None if UTF-8 encodes it.

    A lone surrogate is the one kind of ``str`` that UTF-8 cannot encode; JSON spells it (``"\\ud800"``) and
    Python makes it of undecodable bytes in argv. No tokenizer, results file or HTTP body takes it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.object[exc.start : exc.end], exc.start
    return None
