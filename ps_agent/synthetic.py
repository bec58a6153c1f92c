"""A deterministic synthetic multi-hop world: fictional entities, one passage each, and questions whose
width (parallel sub-queries) and depth (sequential hops) are controlled.

    ps-agent synth --seed 0 --entities 200 --out DIR   →   DIR/corpus.jsonl, DIR/questions.jsonl

Entities are countries, cities, people, companies and works (and, in a ``ranked`` world, mountains and lakes) with
attributes and relations; every question carries its answer, its ``family`` (how it was made: one function per
family below ``questions``, two of them for ``hybrid``), its ``type`` (``comparison``, yes/no comparisons included /
``bridge`` / ``hybrid`` / none for single-hop), the gold plan (sub-questions grouped by search round, each with the
id of the passage that answers it and what it finds there), and the optimal number of search rounds and LLM calls.
The names are invented, so a model cannot answer from memory.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ps_agent.llms import Completion
from ps_agent.protocol import render_answer, render_search
from ps_agent.questions import plan_rounds
from ps_agent.retrieval.corpus import passage_id

#: the worlds gold episodes are made from (training/gold.py), and the one the benchmarks hold out from them
TRAIN_SEEDS = (101, 102, 103, 104, 105, 106)
HELD_OUT_SEED = 7

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ia", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "rk", "nd", "x"]
_OCCUPATIONS = ["cartographer", "composer", "engineer", "botanist", "architect", "astronomer", "sculptor", "chemist"]
_WORK_KINDS = ["novel", "film", "opera", "album", "play"]
_WORK_NOUNS = ["Letters", "Tide", "Garden", "Crown"]
_INDUSTRIES = ["shipping", "textile", "glassworks", "printing", "clockmaking", "brewing"]


@dataclass
class Entity:
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return self.name


class World:
    """Entities of a seed; ``passage(e)`` is the one passage that states an entity's facts. ``ranked``: add three
    ranked mountains and lakes per country (``_ranked``), and with them the ranked question family; half of its
    yes/no pairs are then searched by the bare names and read as the sentence that states the value compared."""

    def __init__(self, seed: int, entities: int, ranked: bool = False) -> None:
        if entities < 40:
            raise ValueError(f"entities must be at least 40 for every question family, got {entities}")
        self.rng = random.Random(seed)
        self._names: set[str] = set()
        n_city, n_person = entities // 5, entities * 2 // 5
        n_company = n_work = (entities - n_city - n_person) // 2
        self.countries = [
            Entity("country", self._name().capitalize() + "ia", {"independence": self.rng.randint(1500, 1990)})
            for _ in range(max(3, n_city // 4))
        ]
        self.cities = [
            Entity("city", self._name(2).capitalize() + self.rng.choice(["ton", "burg", "mouth", "holm", "grad"]), {
                "country": self.rng.choice(self.countries).name,
                "founded": self.rng.randint(800, 1700),
                "population": self.rng.randint(5, 900) * 1000,
            })
            for _ in range(n_city)
        ]  # fmt: skip
        self.people = [
            Entity("person", f"{self._name().capitalize()} {self._name(2).capitalize()}", {
                "born": self.rng.randint(1700, 1990),
                "city": self.rng.choice(self.cities).name,
                "occupation": self.rng.choice(_OCCUPATIONS),
            })
            for _ in range(n_person)
        ]  # fmt: skip
        self.companies = [
            Entity("company", f"{self._name(2).capitalize()} {self.rng.choice(['Works', 'Company', 'Group'])}", {
                "founder": self.rng.choice(self.people).name,
                "city": self.rng.choice(self.cities).name,
                "founded": self.rng.randint(1750, 2010),
                "industry": self.rng.choice(_INDUSTRIES),
            })
            for _ in range(n_company)
        ]  # fmt: skip
        self.works = [
            Entity("work", f"The {self._name(2).capitalize()} {self.rng.choice(_WORK_NOUNS)}", {
                "creator": self.rng.choice(self.people).name,
                "year": self.rng.randint(1750, 2020),
                "kind": self.rng.choice(_WORK_KINDS),
            })
            for _ in range(n_work)
        ]  # fmt: skip
        measures = random.Random(seed + 104_729)  # quantities with units: a second stream leaves the first's draws
        for person in self.people:
            person.attrs["height"] = measures.randint(150, 205)
        for city in self.cities:
            city.attrs["area"] = measures.randint(20, 2500)
            city.attrs["elevation"] = measures.randint(2, 3000)
        self.ranked = ranked
        self.mountains = self._ranked("mountain", 2500, 8000) if ranked else []
        self.lakes = self._ranked("lake", 150, 9000) if ranked else []
        self.by_name = {e.name: e for e in self.entities}

    def _ranked(self, kind: str, low: int, high: int) -> list[Entity]:
        """Three mountains (height) or lakes (area) per country, ranked: the first is the country's highest or
        largest, the second the next, the third smaller than both. Their passages state the ranks the way
        encyclopedias do (``ranked_text``). Drawn after every other entity, so the rest of a world is what it was
        without them."""
        out = []
        for country in self.countries:
            top = self.rng.randint(low, high)
            second = top - self.rng.randint(1, max(2, top // 6))
            third = max(low // 10, second - self.rng.randint(1, max(2, second // 3)))
            for rank, value in enumerate((top, second, third), 1):
                name = self._name(2).capitalize()
                out.append(Entity(kind, f"{'Mount' if kind == 'mountain' else 'Lake'} {name}", {
                    "country": country.name, "rank": rank, "value": value, "named": self.rng.randint(1700, 1950),
                }))  # fmt: skip
            out[-2].attrs |= {"after": out[-3].name, "after_value": top}
        return out

    @property
    def entities(self) -> list[Entity]:
        return self.countries + self.cities + self.people + self.companies + self.works + self.mountains + self.lakes

    def _name(self, syllables: int = 1) -> str:
        while True:
            name = "".join(
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                for _ in range(syllables + 1)
            )
            if name not in self._names:
                self._names.add(name)
                return name

    def text(self, e: Entity) -> str:
        """The passage of an entity, from one of several templates (chosen by a stable hash of its name)."""
        a = e.attrs
        pick = sum(map(ord, e.name)) % 2
        if e.kind == "person":
            return [
                f"{e.name} (born {a['born']} in {a['city']}) was a {a['occupation']}. "
                f"{e.name} was {a['height']} cm tall.",
                f"{e.name} was a {a['occupation']} born in {a['city']} in the year {a['born']}, and stood "
                f"{a['height']} cm tall.",
            ][pick]
        if e.kind == "city":
            return [
                f"{e.name} is a city in {a['country']}, founded in {a['founded']}, with a population of "
                f"{a['population']}. It covers {a['area']:,} square kilometres at an elevation of "
                f"{a['elevation']:,} metres.",
                f"Founded in {a['founded']}, {e.name} is a city of {a['population']} people in {a['country']}, "
                f"{a['elevation']:,} metres above sea level, with an area of {a['area']:,} square kilometres.",
            ][pick]
        if e.kind in _RANKED:
            return ranked_text(e)
        if e.kind == "country":
            return [
                f"{e.name} is a country that became independent in {a['independence']}.",
                f"The country of {e.name} gained its independence in {a['independence']}.",
            ][pick]
        if e.kind == "company":
            return [
                f"{e.name} is a {a['industry']} company founded in {a['founded']} by {a['founder']}, "
                f"headquartered in {a['city']}.",
                f"Founded by {a['founder']} in {a['founded']}, {e.name} is a {a['industry']} firm "
                f"based in {a['city']}.",
            ][pick]
        return [
            f"{e.name} is a {a['kind']} by {a['creator']}, first released in {a['year']}.",
            f"First released in {a['year']}, {e.name} is a {a['kind']} created by {a['creator']}.",
        ][pick]

    def first_sentence(self, e: Entity) -> str:
        """The first sentence of an entity's passage (without its full stop): where every template states the
        values a yes/no or ranked pair compares, and what a step read as real questions are quotes."""
        return self.text(e).split(". ")[0].rstrip(".")

    def pid(self, e: Entity) -> str:
        return passage_id(e.title, self.text(e))

    def corpus(self) -> list[dict[str, str]]:
        return [{"id": self.pid(e), "contents": f'"{e.title}"\n{self.text(e)}'} for e in self.entities]


# Ranked entities: (superlative, second's rank, unit, the verb stating a value, how a passage dates the entity).
_RANKED = {
    "mountain": ("highest", "second-highest", "metres", "rises {value} above sea level", "first climbed in {year}"),
    "lake": ("largest", "second-largest", "square kilometres", "covers {value}", "first mapped in {year}"),
}


def ranked_text(e: Entity) -> str:
    """The passage of a ranked mountain or lake, as encyclopedias state ranks: the first of a country is called
    its highest (largest), with its value in one passage of three and without it in the others ("Mount Everest is
    the highest mountain on Earth"); the second states its value and the first's ("K2, at 8,611 metres, is the
    second-highest mountain on Earth, after Mount Everest at 8,849 metres"); the third states its own. Each also
    states a year, which is not the value compared."""
    a = e.attrs
    most, second, unit, verb, dated = _RANKED[e.kind]
    value, year = f"{a['value']:,} {unit}", dated.format(year=a["named"])
    pick = sum(map(ord, e.name)) % 2  # as World.text picks a template
    if a["rank"] == 1:
        superlative = f"the {most} {e.kind} in {a['country']}"
        if stated_value(e):
            return f"{e.name} is {superlative}: it {verb.format(value=value)}. It was {year}."
        return [f"{e.name} is {superlative}. It was {year}.", f"{e.name}, {year}, is {superlative}."][pick]
    if a["rank"] == 2:
        after = f"{a['after_value']:,} {unit}"
        return [
            f"{e.name}, at {value}, is the {second} {e.kind} in {a['country']}, after {a['after']} at {after}.",
            f"{e.name} is the {second} {e.kind} in {a['country']} ({value}), after {a['after']} ({after}). "
            f"It was {year}.",
        ][pick]
    return [
        f"{e.name} is a {e.kind} in {a['country']} that {verb.format(value=value)}. It was {year}.",
        f"{year.capitalize()}, {e.name} {verb.format(value=value)} in {a['country']}.",
    ][pick]


def stated_value(e: Entity) -> bool:
    """Whether a ranked entity's own passage states its value: always below the first rank; for one of three
    first-ranked, by a stable hash of the name (the others are called the highest or largest, without a number)."""
    return e.attrs["rank"] > 1 or sum(map(ord, e.name)) % 3 == 0


def ranked_step(world: World, e: Entity, other: Entity, as_named: bool = False) -> dict[str, Any]:
    """The plan step that reads a ranked entity's value for a comparison with ``other``: ``entity``, its own
    ``value`` when its passage states one; else the rank its passage states (``superlative``), the country both lie
    in (``place``), and its value as ``other``'s passage states it (``value_there``), when it does.
    The search and the finding are ``X height`` and the value or rank read, or with ``as_named`` as real questions
    have them: the bare name, and the passage's sentence that states the value or rank."""
    most, _, unit, _, _ = _RANKED[e.kind]
    step: dict[str, Any] = {"entity": e.name, "passage_id": world.pid(e)}
    if stated_value(e):
        step["value"] = f"{e.attrs['value']:,} {unit}"
    else:
        step |= {"superlative": f"the {most} {e.kind} in {e.attrs['country']}", "place": e.attrs["country"]}
        if other.attrs.get("after") == e.name:
            step["value_there"] = f"{e.attrs['value']:,} {unit}"
    if as_named:  # every ranked passage states its value or rank in its first sentence
        return step | {"sub_question": e.name, "finding": world.first_sentence(e)}
    noun = "height" if e.kind == "mountain" else "area"
    return step | {"sub_question": f"{e.name} {noun}", "finding": step.get("value") or step["superlative"]}


def yes_no_step(world: World, e: Entity, attr: str, noun: str, as_named: bool = False) -> dict[str, Any]:
    """The plan step that reads the value a yes/no pair compares: searched as ``X occupation`` and read as the bare
    value; or, ``as_named``, searched by the bare name and read as the passage's first sentence (which states the
    value), the value kept beside it for the check the answer spells out."""
    if as_named:
        step = {"sub_question": e.name, "passage_id": world.pid(e), "finding": world.first_sentence(e)}
        return step | {"value": str(e.attrs[attr])}
    return {"sub_question": f"{e.name} {noun}", "passage_id": world.pid(e), "finding": str(e.attrs[attr])}


_RANKED_QUESTIONS = {
    "mountain": {
        "max": ["Which mountain is higher, {a} or {b}?", "Which is taller: {a} or {b}?",
                "Which of {a} and {b} rises higher above sea level?"],
        "min": ["Which mountain is lower, {a} or {b}?", "Which peak is lower: {a} or {b}?",
                "Which of {a} and {b} is the lower mountain?"]},
    "lake": {
        "max": ["Which lake is larger, {a} or {b}?", "Which lake covers more area: {a} or {b}?",
                "Which of {a} and {b} is the bigger lake?"],
        "min": ["Which lake is smaller, {a} or {b}?", "Which lake covers less area: {a} or {b}?",
                "Which of {a} and {b} is the smaller lake?"]},
}  # fmt: skip

# Comparisons: (entity kind, attribute compared, sub-question noun, unit of its value, questions). Questions come
# in pairs (two entities, more), asking for the smallest value ("min") or the largest ("max") in words that vary:
# a policy taught only "first" and "most" read "taller" as "the shortest" (docs/results.md, 2026-11-26).
# City sub-questions name the kind and the passage's own words: people and companies name their city too.
_COMPARISONS = [
    ("person", "born", "birth year", "", {
        "min": [("Who was born first: {names}?",) * 2, ("Who is older: {names}?", "Who is the oldest: {names}?")],
        "max": [("Which of these people was born most recently: {names}?",) * 2,
                ("Who is younger: {names}?", "Who is the youngest: {names}?")]}),
    ("person", "height", "height", "cm", {
        "min": [("Who is shorter: {names}?", "Who is the shortest: {names}?")],
        "max": [("Who is taller: {names}?", "Who is the tallest: {names}?")]}),
    ("city", "founded", "city founded", "", {
        "min": [("Which city was founded earlier: {names}?", "Which city was founded earliest: {names}?"),
                ("Which city is older: {names}?", "Which city is the oldest: {names}?")],
        "max": [("Which city was founded later: {names}?", "Which city was founded last: {names}?")]}),
    ("city", "population", "city population", "", {
        "min": [("Which city has fewer inhabitants: {names}?", "Which city has the fewest inhabitants: {names}?"),
                ("Which city is smaller by population: {names}?", "Which city has the smallest population: {names}?")],
        "max": [("Which city has more inhabitants: {names}?", "Which city has the most inhabitants: {names}?"),
                ("Which city is bigger by population: {names}?", "Which city has the largest population: {names}?")]}),
    ("city", "area", "city area", "square kilometres", {
        "min": [("Which city covers less land: {names}?", "Which city has the smallest area: {names}?")],
        "max": [("Which city is larger in area: {names}?", "Which city covers the most land: {names}?")]}),
    ("city", "elevation", "city elevation", "metres", {
        "min": [("Which city lies lower: {names}?", "Which city lies lowest: {names}?")],
        "max": [("Which city lies higher: {names}?", "Which city is the highest above sea level: {names}?")]}),
    ("company", "founded", "founding year", "", {
        "min": [("Which company is older: {names}?", "Which company is the oldest: {names}?")],
        "max": [("Which company is newer: {names}?", "Which company was founded most recently: {names}?")]}),
    ("work", "year", "release year", "", {
        "min": [("Which work was released first: {names}?",) * 2],
        "max": [("Which work is more recent: {names}?", "Which work was released last: {names}?")]}),
]  # fmt: skip

# Yes/no comparisons of two entities: (entity kind, attribute, sub-question noun, question). A "{value}" question
# asks whether both have that value, the others whether the two values are the same.
_YES_NO = [
    ("person", "occupation", "occupation", "Were {a} and {b} both {value}s?"),
    ("person", "occupation", "occupation", "Did {a} and {b} have the same occupation?"),
    ("person", "city", "birthplace", "Were {a} and {b} born in the same city?"),
    ("city", "country", "country", "Are {a} and {b} in the same country?"),
    ("company", "industry", "industry", "Are {a} and {b} both {value} companies?"),
    ("company", "city", "headquarters", "Are {a} and {b} based in the same city?"),
    ("work", "kind", "form", "Are {a} and {b} both {value}s?"),
]

# Comparisons that pick by a category, not a number, as a third of HotpotQA's named comparisons do ("Which artist
# is a lyricist, X or Y?", "What profession do X and Y share?"): (entity kind, attribute, sub-question noun, the
# question asking which of two has the value, the question asking for the value both have).
_CATEGORIES = [
    ("person", "occupation", "occupation", "Which of {a} and {b} was a {value}?",
     "What occupation did {a} and {b} share?"),
    ("city", "country", "country", "Which city is in {value}, {a} or {b}?", "Which country are {a} and {b} both in?"),
    ("company", "industry", "industry", "Which is a {value} company, {a} or {b}?",
     "What industry are {a} and {b} both in?"),
    ("work", "kind", "form", "Which is a {value}, {a} or {b}?", "What form do {a} and {b} share?"),
]  # fmt: skip

# Relations a bridge hop follows: (entity kind, attribute naming another entity, phrase for the question,
# sub-question for the search).
_HOPS = {
    "company": ("founder", "the founder of {}", "{} founder"),
    "work": ("creator", "the creator of {}", "{} creator"),
    "person": ("city", "the birthplace of {}", "{} birthplace"),
    "city": ("country", "the country of {}", "{} country"),
}
# What a chain of d rounds asks at its end: d - 1 hops lead from a company or work to this kind.
_FINAL = {2: ("person", "born", "birth year"), 3: ("city", "founded", "city founded"),
          4: ("country", "independence", "independence year")}  # fmt: skip


def _step(world: World, name: str) -> tuple[str, str, str]:
    """One hop from an entity: (next entity, noun phrase, sub-question)."""
    e = world.by_name[name]
    attr, phrase, query = _HOPS[e.kind]
    return e.attrs[attr], phrase, query.format(name)


def _chain(world: World, rng: random.Random, depth: int, start: Entity | None = None) -> dict[str, Any]:
    """A chain of ``depth`` search rounds: ``depth - 1`` hops from a company or work (``start``, else drawn), then
    one attribute."""
    kind, attr, noun = _FINAL[depth]
    start = start or rng.choice(world.companies + world.works)
    plan, phrase, current = [], "{}", start.name
    for _ in range(depth - 1):
        nxt, hop_phrase, query = _step(world, current)
        plan.append({"sub_question": query, "passage_id": world.pid(world.by_name[current]), "finding": nxt})
        phrase = hop_phrase.format(phrase)
        current = nxt
    end = world.by_name[current]
    assert end.kind == kind
    plan.append({"sub_question": f"{current} {noun}", "passage_id": world.pid(end), "finding": str(end.attrs[attr])})
    return {"phrase": phrase, "start": start.name, "end": end, "value": end.attrs[attr], "plan": plan}


#: ``add(family, type, question, answer, rounds, **extra)``: a family's question, appended to the world's list
Add = Callable[..., None]


def questions(world: World, seed: int, per_family: int = 3, categories: bool = False) -> list[dict[str, Any]]:
    """Questions of every family: comparison k = 2..8, bridge depth d = 2..4, hybrids, single-hop, yes/no
    comparisons of two, hybrids that ask for the start of the chain, and ranked pairs (a world built with them);
    ``categories``: then the category comparisons (``_categories``). The families draw from one random stream, in
    this order, so a seed gives the same questions, and the same first ones with ``categories``."""
    rng = random.Random(seed + 1)
    out: list[dict[str, Any]] = []

    def add(family: str, qtype: str | None, question: str, answer: str, rounds: list[list[dict]], **extra: Any):
        out.append({
            "id": f"synth-{seed}-{len(out)}", "question": question, "golden_answers": [answer], "type": qtype,
            "family": family, "plan": rounds, "optimal_rounds": len(rounds), "optimal_llm_calls": len(rounds) + 1,
            **extra,
        })  # fmt: skip

    for family in (_comparisons, _bridges, _hybrids, _single_hops, _yes_nos, _start_hybrids, _ranked_pairs):
        family(world, rng, per_family, add)
    if categories:
        _categories(world, rng, per_family, add)
    return out


def _of_kind(world: World) -> dict[str, list[Entity]]:
    return {"person": world.people, "city": world.cities, "company": world.companies, "work": world.works}


def _comparisons(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """Which of k = 2..8 entities has the least or most of an attribute; all k searched in one round."""
    for k in range(2, 9):
        for _ in range(per_family):
            kind, attr, noun, unit, asked = rng.choice(_COMPARISONS)
            wanted = rng.choice(["min", "max"])
            items = rng.sample(_of_kind(world)[kind], k)
            if len({e.attrs[attr] for e in items}) < k:
                continue
            pick = (min if wanted == "min" else max)(items, key=lambda e: e.attrs[attr])
            names = ", ".join(e.name for e in items[:-1]) + f" or {items[-1].name}"
            plan = [[
                {"sub_question": f"{e.name} {noun}", "passage_id": world.pid(e),
                 "finding": f"{e.attrs[attr]:,} {unit}" if unit else str(e.attrs[attr])}
                for e in items
            ]]  # fmt: skip
            question = rng.choice(asked[wanted])[0 if k == 2 else 1].format(names=names)
            add("comparison", "comparison", question, pick.name, plan, k=k, depth=1)


def _bridges(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """A year at the end of a chain of depth 2..4, one search round per hop."""
    for depth in range(2, 5):
        for _ in range(per_family):
            chain = _chain(world, rng, depth)
            verb = {2: "born", 3: "founded", 4: "made independent"}[depth]
            question = f"In which year was {chain['phrase'].format(chain['start'])} {verb}?"
            add("bridge", "bridge", question, str(chain["value"]), [[s] for s in chain["plan"]], k=1, depth=depth)


def _hybrids(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """Which of k = 2, 3 chains of depth 2, 3 ends first: the chains searched side by side, one round per hop."""
    for k in (2, 3):
        for depth in (2, 3):
            for _ in range(per_family):
                chains = [_chain(world, rng, depth) for _ in range(k)]
                values = [c["value"] for c in chains]
                if len(set(values)) < k or len({c["start"] for c in chains}) < k:
                    continue
                first = min(chains, key=lambda c: c["value"])
                subjects = [c["phrase"].format(c["start"]) for c in chains]
                verb = "born" if depth == 2 else "founded"
                question = f"Which was {verb} first: {', '.join(subjects[:-1])} or {subjects[-1]}?"
                answer = first["end"].name
                rounds = [[c["plan"][i] for c in chains] for i in range(depth)]
                add("hybrid", "hybrid", question, answer, rounds, k=k, depth=depth)


def _single_hops(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """A person's birth year: one search."""
    for _ in range(per_family * 2):
        person = rng.choice(world.people)
        born = str(person.attrs["born"])
        plan = [[{"sub_question": f"{person.name} birth year", "passage_id": world.pid(person), "finding": born}]]
        add("single-hop", None, f"In which year was {person.name} born?", born, plan, k=1, depth=1)


def _read_pair(
    world: World, rng: random.Random, kind: str, attr: str, noun: str, same: bool, as_named: bool
) -> tuple[list[Entity], list[list[dict[str, Any]]]] | None:
    """Two entities of ``kind`` whose ``attr`` is the same (or differs), in random order, and the search round
    that reads both values (``yes_no_step``; ``as_named``: searched and read as real questions are); None when the
    first entity drawn has no such partner."""
    pool = _of_kind(world)[kind]
    a = rng.choice(pool)
    others = [e for e in pool if e is not a and (e.attrs[attr] == a.attrs[attr]) == same]
    if not others:
        return None
    pair = [a, rng.choice(others)]
    rng.shuffle(pair)
    return pair, [[yes_no_step(world, e, attr, noun, as_named) for e in pair]]


def _yes_nos(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """Whether two entities share an attribute value, half answered yes and half no."""
    for i in range(per_family * 2):
        kind, attr, noun, question_form = rng.choice(_YES_NO)
        drawn = _read_pair(world, rng, kind, attr, noun, same=i % 2 == 0, as_named=world.ranked and i % 4 >= 2)
        if drawn is None:
            continue
        pair, plan = drawn
        value = rng.choice(pair).attrs[attr]  # a "both" question asks for one of the two values
        question = question_form.format(a=pair[0].name, b=pair[1].name, value=value)
        add("yes-no", "comparison", question, "yes" if i % 2 == 0 else "no", plan, k=2, depth=1)


def _categories(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """Two entities compared by a category: which of the two has the value the question names (they differ), or
    what value both have (they share it); the two searched in one round, read as ``yes_nos`` reads them."""
    for i in range(per_family * 4):
        kind, attr, noun, which, shared = rng.choice(_CATEGORIES)
        drawn = _read_pair(world, rng, kind, attr, noun, same=i % 2 == 1, as_named=world.ranked and i % 4 >= 2)
        if drawn is None:
            continue
        pair, plan = drawn
        if i % 2 == 0:
            pick = rng.choice(pair)
            question, answer = which.format(a=pair[0].name, b=pair[1].name, value=pick.attrs[attr]), pick.name
        else:
            question, answer = shared.format(a=pair[0].name, b=pair[1].name), str(pair[0].attrs[attr])
        add("category", "comparison", question, answer, plan, k=2, depth=1)


# Hybrid questions in 2Wiki's form: which of two works or companies has the creator or founder born first (``min``)
# or last (``max``); the answer is the work or company, not the person.
_BY_START = {
    "min": [
        "Which {noun} has the {role} born first, {a} or {b}?",
        "Which {noun} has the {role} who is older, {a} or {b}?",
        "Which {noun} has the {role} who was born earlier, {a} or {b}?",
    ],
    "max": [
        "Which {noun} has the {role} born later, {a} or {b}?",
        "Which {noun} has the {role} who is younger, {a} or {b}?",
        "Which {noun} whose {role} was born more recently, {a} or {b}?",
    ],
}


def _start_hybrids(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """Hybrids that ask for the start of the chain, as 2Wiki asks its own: which work or company has the creator or
    founder born first (``_BY_START``)."""
    for _ in range(per_family * 2):
        kind = rng.choice(["work", "company"])
        starts = rng.sample(world.works if kind == "work" else world.companies, 2)
        chains = [_chain(world, rng, 2, start) for start in starts]
        born = [c["value"] for c in chains]
        if born[0] == born[1]:
            continue
        wanted = rng.choice(["min", "max"])
        pick = (min if wanted == "min" else max)(chains, key=lambda c: c["value"])
        forms = {e.attrs.get("kind") for e in starts}  # a work's form (album, film, …); none for a company
        noun = forms.pop() if kind == "work" and len(forms) == 1 else kind
        role = _HOPS[kind][0]
        form = rng.choice(_BY_START[wanted])
        question = form.format(noun=noun, role=role, a=starts[0].name, b=starts[1].name)
        rounds = [[c["plan"][i] for c in chains] for i in range(2)]
        add("hybrid", "hybrid", question, pick["start"], rounds, k=2, depth=2, answer_round=0)


def _ranked_pairs(world: World, rng: random.Random, per_family: int, add: Add) -> None:
    """Ranked pairs (a world built with them): a value stated as a rank, or only in the other entity's passage."""
    for i in range(per_family * 3 if world.mountains else 0):
        group = world.mountains if i % 2 == 0 else world.lakes
        first = 3 * rng.randrange(len(group) // 3)
        pair = rng.sample(group[first : first + 3], 2)  # any two of a country's three, in either order
        wanted = rng.choice(["min", "max"])
        pick = (min if wanted == "min" else max)(pair, key=lambda e: e.attrs["value"])
        question = rng.choice(_RANKED_QUESTIONS[pair[0].kind][wanted]).format(a=pair[0].name, b=pair[1].name)
        as_named = i % 4 >= 2  # half searched and read as real questions are: bare names, sentences
        plan = [[ranked_step(world, pair[0], pair[1], as_named), ranked_step(world, pair[1], pair[0], as_named)]]
        add("ranked", "comparison", question, pick.name, plan, k=2, depth=1)


def generate(
    seed: int, entities: int, out: str | Path, per_family: int = 3, ranked: bool = False, categories: bool = False
) -> tuple[Path, Path]:
    """Write ``corpus.jsonl`` and ``questions.jsonl`` for a seed: same seed and sizes, same bytes. ``ranked``: with
    the ranked mountains and lakes and their questions; ``categories``: with the category comparisons (both off by
    default: the held-out world and the gold the shipped adapters were trained on are without them)."""
    if not isinstance(per_family, int) or per_family < 1:
        raise ValueError(f"per_family must be at least 1 (questions per family setting), got {per_family!r}")
    world = World(seed, entities, ranked)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus, qs = out / "corpus.jsonl", out / "questions.jsonl"
    corpus.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in world.corpus()))
    rows = questions(world, seed, per_family, categories)
    qs.write_text("".join(json.dumps(q, sort_keys=True) + "\n" for q in rows))
    return corpus, qs


class GoldPlanPolicy:
    """An oracle standing in for the model (a test and benchmark double): it searches each synthetic
    question's gold plan round by round, then answers, in the text protocol.

    With the real graph and a real index, it proves the plumbing — graph, retrieval, parsing, scoring —
    and gives the optimal number of LLM calls to compare a model against.
    """

    def __init__(self, questions: list[dict[str, Any]], mode: str = "parallel") -> None:
        self.plans = {q["question"]: q for q in questions}
        self.mode = mode

    async def acomplete(self, prompt, transcript, *, stop, max_tokens):
        question = prompt[-1]["content"].rsplit("Question: ", 1)[1].strip()
        q = self.plans[question]
        steps = [[s["sub_question"] for s in r] for r in plan_rounds(q["plan"], self.mode)]
        done = sum(segment["role"] == "model" for segment in transcript)
        if done < len(steps):
            text = f"<think> step {done + 1} of the plan </think>\n{render_search(steps[done])}"
        else:
            text = f"<think> the plan is done </think>\n{render_answer(q['golden_answers'][0])}"
        return Completion(text=text, prompt_text=prompt[-1]["content"])
