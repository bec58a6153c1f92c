"""Comparisons paired from the shared train parts' gold passages (``gold.py --pairs``).

HotpotQA and 2Wiki ask their comparisons over two Wikipedia leads ("Who was born first, A or B?", "Are A and B of
the same nationality?"), and their train parts hold about 180 of them: too few to learn to read real leads from
(the synthetic worlds' passages are templates). The people and films among the train parts' gold passages pair
into many more questions over the same kind of text. Each is made from two leads that state what it asks:

- ``born`` and ``died``: a person's dates in the lead's opening parenthesis (``Jo Park (3 May 1901 – 9 June
  1970) was …``), when they are the passage's first dates, the ones the teacher quotes;
- ``film``: a film's year in its first sentence (``is a 1955 American film``), when it is the passage's first date;
- ``nationality`` and ``occupation``: yes/no questions over what a person's first sentence says (``is an American
  singer``), half answered yes and half no;
- ``shared`` and ``demonym``: what two people's first sentences both name, asked as HotpotQA asks it ("What
  profession do A and B share?" → ``actor``, "What sport is played by both A and B?" → ``tennis``, "A and B are
  both this nationality?" → ``American``), where they name exactly one such value in common.

No passage that is also a gold passage of the validation part is used. Each question's plan is read as a shared
question's is (``plans.plan_from_titles``), and a question is kept only where the check the teacher spells out
(``turns.answer_verdict``) gives its answer; the others are counted by reason.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from ps_agent.questions import SHARED_DATA, read_split
from training.plans import GoldQuestion, GoldSet, passages_by_id, plan_from_titles
from training.reading import (
    asked_date,
    asked_direction,
    demonym,
    finding_value,
    first_date,
    nation_in,
    passage_body,
    plain_title,
    quote,
)
from training.turns import answer_verdict

#: what the source of a paired question ends with (``hotpotqa-pairs``)
SOURCE_SUFFIX = "-pairs"

#: a paired question, its answer, and the check its answer turn spells out where ``answer_verdict`` has none
Asked = tuple[str, str, str | None]

#: what ``paired_questions`` asks, by default all of it
PAIR_KINDS = ("born", "died", "film", "nationality", "occupation", "shared", "demonym")

#: the passages a kind is paired from, where they are another kind's
_POOL = {"shared": "occupation", "demonym": "nationality"}

#: what each kind asks, by the extreme it wants: the wordings HotpotQA and 2Wiki use
_ASKED = {
    "born": {
        "earliest": ["Who was born first, {a} or {b}?", "Who is older, {a} or {b}?",
                     "Who was born earlier, {a} or {b}?", "Which person was born first, {a} or {b}?"],
        "latest": ["Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?",
                   "Who was born more recently, {a} or {b}?"],
    },
    "died": {
        "earliest": ["Who died first, {a} or {b}?", "Who died earlier, {a} or {b}?"],
        "latest": ["Who died later, {a} or {b}?", "Who died more recently, {a} or {b}?"],
    },
    "film": {
        "earliest": ["Which film came out first, {a} or {b}?", "Which film was released first, {a} or {b}?",
                     "Which film is older, {a} or {b}?"],
        "latest": ["Which film came out later, {a} or {b}?", "Which film was released more recently, {a} or {b}?",
                   "Which film is newer, {a} or {b}?"],
    },
}  # fmt: skip

_SAME_NATION = [
    "Are {a} and {b} of the same nationality?",
    "Do {a} and {b} have the same nationality?",
    "Were {a} and {b} from the same country?",
]
_BOTH = ["Are {a} and {b} both {plural}?", "Were {a} and {b} both {plural}?", "Are both {a} and {b} {plural}?"]
_SHARED = {
    "profession": ["What profession do {a} and {b} share?", "What profession did {a} and {b} have in common?",
                   "What occupation do {a} and {b} have in common?"],
    "sport": ["What sport is played by both {a} and {b}?", "What sport did {a} and {b} both play?"],
    "nationality": ["{a} and {b} are both this nationality?", "What nationality are both {a} and {b}?",
                    "What nationality do {a} and {b} share?"],
}  # fmt: skip

#: occupations a person's first sentence names (``is an American film director``)
_OCCUPATIONS = (
    "actor", "actress", "singer", "songwriter", "musician", "rapper", "guitarist", "drummer", "bassist", "pianist",
    "composer", "conductor", "record producer", "film producer", "film director", "director", "screenwriter",
    "writer", "novelist", "poet", "playwright", "journalist", "author", "comedian", "dancer", "model", "painter",
    "sculptor", "photographer", "architect", "politician", "diplomat", "lawyer", "judge", "businessman",
    "entrepreneur", "footballer", "cricketer", "boxer", "wrestler", "golfer", "swimmer", "cyclist", "tennis player",
    "basketball player", "engineer", "mathematician", "physicist", "chemist", "economist", "historian",
    "philosopher", "astronaut", "television presenter",
)  # fmt: skip
#: the sport an occupation plays (``tennis player`` → tennis)
_SPORTS = {
    "footballer": "football", "cricketer": "cricket", "boxer": "boxing", "wrestler": "wrestling", "golfer": "golf",
    "swimmer": "swimming", "cyclist": "cycling", "tennis player": "tennis", "basketball player": "basketball",
}  # fmt: skip
_OCCUPATION_RE = re.compile(r"\b(" + "|".join(sorted(_OCCUPATIONS, key=len, reverse=True)) + r")\b")  # longest first
_PERSON_LEAD = re.compile(r"^[^()]{1,120}?\(([^()]{4,200})\)")
_FILM_LEAD = re.compile(r"\b(?:is|was) an? (\d{4}) (?:[\w'-]+ ){0,4}film\b")


def passage_kinds(contents: str) -> set[str]:
    """The kinds of question a passage can be paired for:
    - ``born``: its lead's opening parenthesis holds the passage's first date, in a life span or after "born"
      (``Lola Montès (1955) is a film`` is no person); ``died`` as well where it is a life span;
    - ``nationality`` and ``occupation``: such a person's first sentence names a country or an occupation;
    - ``film``: its first sentence dates a film by the passage's first date (``is a 1955 American film``)."""
    kinds: set[str] = set()
    body, first = passage_body(contents), quote(contents)
    date = first_date(contents)
    lead = _PERSON_LEAD.search(body)
    if date and lead and date in lead.group(1) and re.search(r"\bborn\b|\d\s*[–—-]\s*\S", lead.group(1)):
        kinds.add("born")
        if asked_date(contents, "Who died first?"):
            kinds.add("died")
        if nation_in(first):
            kinds.add("nationality")
        if occupation(first):
            kinds.add("occupation")
    film = _FILM_LEAD.search(first)
    if film and date == film.group(1):
        kinds.add("film")
    return kinds


def occupation(sentence: str) -> str | None:
    """The first occupation a sentence names (``film director``), or None."""
    found = _OCCUPATION_RE.search(sentence.lower())
    return found.group(1) if found else None


def occupations(sentence: str) -> list[str]:
    """Every occupation a sentence names, in order (``actor, screenwriter and film director``)."""
    return list(dict.fromkeys(_OCCUPATION_RE.findall(sentence.lower())))


def _plural(noun: str) -> str:
    """``actress`` → ``actresses``, ``businessman`` → ``businessmen``, ``singer`` → ``singers``."""
    if noun.endswith(("s", "sh", "ch", "x")):
        return f"{noun}es"
    return f"{noun[:-3]}men" if noun.endswith("man") else f"{noun}s"


def paired_questions(
    name: str, per_kind: int, seed: int = 0, root: Path = SHARED_DATA, kinds: Sequence[str] = PAIR_KINDS
) -> GoldSet:
    """Up to ``per_kind`` questions of each of ``kinds`` (``PAIR_KINDS``) over pairs of the train part's gold
    passages of the shared set ``name``, as gold questions of the source ``NAME-pairs``; the pairs a check does not
    decide are counted in ``skipped``."""
    gold = GoldSet()
    folder = root / name
    if not (folder / "dev.jsonl").is_file() or not (folder / "corpus.jsonl").is_file():
        gold.skipped[f"{name}{SOURCE_SUFFIX}: no dev.jsonl and corpus.jsonl in {folder}"] += 1
        return gold
    passages = passages_by_id(folder / "corpus.jsonl")
    held_out = {i for r in read_split(folder / "dev.jsonl", "validation") for i in r["supporting_doc_ids"] or []}
    train = {i for r in read_split(folder / "dev.jsonl", "train") for i in r["supporting_doc_ids"] or []}
    titles = {i: _title(passages[i]) for i in train if i in passages}
    pool: dict[str, list[str]] = {}
    for i in sorted(set(titles) - held_out):
        if re.search(r"\b(or|and)\b|\?", titles[i]):  # a name that would read as two in "A or B?"
            continue
        for kind in passage_kinds(passages[i]):
            pool.setdefault(kind, []).append(i)
    rng = random.Random(seed)
    source, corpus = f"{name}{SOURCE_SUFFIX}", str(folder / "corpus.jsonl")
    makers: dict[str, Callable[..., Asked | None]] = {  # (passage a, passage b, name a, name b, rng)
        "born": functools.partial(_dated, "born"),
        "died": functools.partial(_dated, "died"),
        "film": functools.partial(_dated, "film"),
        "nationality": _same_nation,
        "occupation": _both,
        "shared": _shared_occupation,
        "demonym": _shared_demonym,
    }
    for kind, make in ((k, makers[k]) for k in kinds):
        ids, made, seen, answers = pool.get(_POOL.get(kind, kind), []), 0, set(), Counter()
        for _ in range(per_kind * 20 if len(ids) > 1 else 0):
            if made >= per_kind:
                break
            a, b = rng.sample(ids, 2)
            if frozenset((a, b)) in seen or titles[a] == titles[b]:
                continue
            seen.add(frozenset((a, b)))
            asked = make(passages[a], passages[b], titles[a], titles[b], rng)
            if asked is None:
                continue
            question, answer, check = asked
            if answers[answer] >= _most(kind, answer, per_kind):
                continue
            record = {
                "question": question, "golden_answers": [answer], "type": "comparison",
                "supporting_titles": [_title(passages[a], plain=False), _title(passages[b], plain=False)],
                "supporting_doc_ids": [a, b],
            }  # fmt: skip
            plan = plan_from_titles(record, passages)
            if check and not isinstance(plan, str):
                plan[-1][0]["check"] = check  # what both name, read the way a category check is (``answer_verdict``)
            q = GoldQuestion(f"{name}-pair-{kind}-{made}", question, [answer], "comparison", plan, source, corpus)
            if isinstance(plan, str) or answer_verdict(q) is None:
                gold.skipped[f"{source}: a {kind} pair the teacher's check does not decide"] += 1
                continue
            gold.questions.append(q)
            answers[answer] += 1
            made += 1
    return gold


def _most(kind: str, answer: str, per_kind: int) -> int:
    """How many of a kind's ``per_kind`` questions may have ``answer``: half for yes and for no, a third (at least
    one) for a value both share (not every nationality American), all for a name."""
    if answer in ("yes", "no"):
        return (per_kind + 1) // 2
    return max(1, (per_kind + 1) // 3) if kind in ("shared", "demonym") else per_kind


def _title(contents: str, plain: bool = True) -> str:
    """A corpus passage's title (``plain``: without its qualifier, as a question names it)."""
    title = contents.split("\n", 1)[0].strip('"')
    return plain_title(title) if plain else title


def _dated(kind: str, a: str, b: str, name_a: str, name_b: str, rng: random.Random) -> Asked | None:
    """Which of two comes first or last, by the dates the teacher reads for the question; None on a tie."""
    wanted = rng.choice(["earliest", "latest"])
    question = rng.choice(_ASKED[kind][wanted]).format(a=name_a, b=name_b)
    first, second = (finding_value(asked_date(p, question)) for p in (a, b))
    if first is None or second is None or first == second or asked_direction(question, True) != wanted:
        return None
    return question, name_a if (first < second) == (wanted == "earliest") else name_b, None


def _same_nation(a: str, b: str, name_a: str, name_b: str, rng: random.Random) -> Asked:
    same = nation_in(quote(a)) == nation_in(quote(b))
    return rng.choice(_SAME_NATION).format(a=name_a, b=name_b), "yes" if same else "no", None


def _both(a: str, b: str, name_a: str, name_b: str, rng: random.Random) -> Asked | None:
    """Whether both are what the first one's first sentence names; None where the second names no other."""
    asked, other = occupation(quote(a)), occupation(quote(b))
    if asked is None or other is None:
        return None
    if other != asked and re.search(rf"\b{re.escape(asked)}", passage_body(b).lower()):
        return None  # the other's passage says it further on: "not both" would be wrong
    return rng.choice(_BOTH).format(plural=_plural(asked), a=name_a, b=name_b), "yes" if other == asked else "no", None


def _shared_occupation(a: str, b: str, name_a: str, name_b: str, rng: random.Random) -> Asked | None:
    """What profession (or sport) both first sentences name, where they name exactly one in common."""
    first, second = occupations(quote(a)), occupations(quote(b))
    shared = [o for o in first if o in second]
    heads = {o.split()[-1] for o in first} & {o.split()[-1] for o in second}  # "director" and "film director"
    if len(shared) != 1 or len(heads) != 1:
        return None
    sport = _SPORTS.get(shared[0])
    asked, answer = ("sport", sport) if sport else ("profession", shared[0])
    check = (
        f"The question asks what {asked} both share. {name_a}: {', '.join(first)}; {name_b}: {', '.join(second)}. "
        f"Both: {shared[0]}."
    )
    return rng.choice(_SHARED[asked]).format(a=name_a, b=name_b), answer, check


def _shared_demonym(a: str, b: str, name_a: str, name_b: str, rng: random.Random) -> Asked | None:
    """The nationality both first sentences name by the same demonym (``English``)."""
    quotes = quote(a), quote(b)
    first, second = (demonym(q) for q in quotes)
    if first is None or first != second or any(re.search(rf"\b{first}-", q) for q in quotes):
        return None  # none, two, or "Italian-American"
    check = f"The question asks what nationality both share. {name_a}: {first}; {name_b}: {second}. Both: {first}."
    return rng.choice(_SHARED["nationality"]).format(a=name_a, b=name_b), first, check
