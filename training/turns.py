"""The gold teacher's turns: the think, search and answer text of a gold plan (``training.plans``), with the check
it spells out before answering, and the ``TextPolicy`` that writes them token-exact.

A think turn names the sub-questions and says why they are (in)dependent; the answer turn says what was read and,
where the passages allow, the check that gives the answer: a comparison of numbers or dates digit by digit
(``comparison_verdict``), a ranked pair (``ranked_verdict``), a yes/no check (``yes_no_verdict``,
``yes_no_reading``), or a chain's answer checked against the question (``title_check``). The policy learns to
answer from what it read.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from ps_agent.llms import Completion, text_ids
from ps_agent.protocol import ChatPrompt, Mode, render_answer, render_search
from ps_agent.questions import plan_rounds, yes_no
from ps_agent.state import Segment
from training.plans import GoldQuestion, GoldSet, ends_on_answer
from training.reading import (
    TIME_WORDS,
    asked_direction,
    asked_phrase,
    asks_same,
    finding_value,
    key_words,
    mentioned,
    nation_in,
    normalised,
    plain_title,
)

_FIRST = {
    "parallelisable": [
        "I need to look up {subs}. These facts are independent of each other, so I search for them in parallel.",
        "The question compares {n} things. Each fact can be found on its own: {subs}. I search them all at once.",
        "To compare them I need {subs}. None of these depends on another, so I split the search.",
    ],
    "hybrid": [
        "The question compares {n} things, and each needs a chain of lookups. The chains do not depend on each "
        "other, so I search their first steps in parallel: {subs}.",
        "Each of the {n} things needs more than one search, but they are independent. I start every chain at "
        "once: {subs}.",
    ],
    "sequential": [
        "The steps of this question depend on each other. First I need {subs}; the next search depends on what I find.",
        "I cannot search everything at once: the second step needs the answer of the first. I start with {subs}.",
        "This is a chain of lookups, so I search one step at a time, starting with {subs}.",
    ],
    "single-hop": [
        "I need to look up {subs}. This is a single fact, so one search is enough.",
        "One search for {subs} should answer this.",
    ],
}

_SEQUENTIAL_FIRST = [
    "I need to look up {all}. I search one query at a time, starting with {subs}.",
    "I search for one thing at a time. First: {subs}.",
]

_NEXT = {
    True: ["I found {found}. Next I need {subs}.", "So {found}. Now I search for {subs}."],
    False: ["The information points to {subs}, so I search for it next.", "Next I need to look up {subs}."],
}

_ANSWER = {
    True: ["I found {found}. So the answer is {answer}.", "So {found}. The answer is {answer}."],
    False: ["The information answers the question: {answer}.", "From the information, the answer is {answer}."],
}

_READ = ["I found {found}.", "The information says {found}.", "From the passages: {found}."]


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def _found(steps: Sequence[dict[str, Any]]) -> str | None:
    if not steps or any(s.get("finding") is None for s in steps):
        return None
    return _and([f"{s['sub_question']}: {s['finding']}" for s in steps])


def teacher_turns(q: GoldQuestion, mode: Mode, rng: random.Random) -> list[str]:
    """The model turns of the gold episode: think + search per round (one query per turn in sequential
    mode), then think + answer. Think text names the sub-questions and says why they are (in)dependent."""
    rounds = plan_rounds(q.plan, mode)
    turns: list[str] = []
    previous: list[dict[str, Any]] = []
    for i, steps in enumerate(rounds):
        subs = _and([s["sub_question"] for s in steps])
        found = _found(previous)
        if i == 0 and mode == "parallel":
            think = rng.choice(_FIRST[q.question_class]).format(subs=subs, n=len(steps))
        elif i == 0:
            every = _and([s["sub_question"] for s in q.plan[0]])
            # a chain opens as one (one search at a time), not as "one search is enough"
            opening = _FIRST["sequential" if q.question_class in ("sequential", "hybrid") else "single-hop"]
            think = rng.choice(_SEQUENTIAL_FIRST if len(q.plan[0]) > 1 else opening)
            think = think.format(all=every, subs=subs)
        else:
            think = rng.choice(_NEXT[found is not None]).format(found=found, subs=subs)
        turns.append(f"<think> {think} </think>\n{render_search([s['sub_question'] for s in steps])}")
        previous = steps
    found = _found(q.plan[-1])  # the last round holds what the answer is read from
    answer = q.golden_answers[0]
    verdict = answer_verdict(q)
    if verdict:
        think = f"{rng.choice(_READ).format(found=found)} {verdict} So the answer is {answer}."
    else:
        think = rng.choice(_ANSWER[found is not None]).format(found=found, answer=answer)
    turns.append(f"<think> {think} </think>\n{render_answer(answer)}")
    return turns


def answer_verdict(q: GoldQuestion) -> str | None:
    """The check the answer turn spells out before answering (a comparison, a ranked pair, a yes/no, or, where the
    last round reads one entity, the ``check`` that ``check_chains`` wrote), or None where no check gives the gold
    answer."""
    if len(q.plan[-1]) < 2:
        return q.plan[-1][0].get("check")  # a chain that ends on its answer, checked (``check_chains``)
    answer = q.golden_answers[0]
    # a hybrid may ask for where each chain started ("Which film has the director born first?"): the first round
    # names what each value belongs to, where each of its findings leads to the entity searched next
    starts = _chain_starts(q.plan)
    return (
        ranked_verdict(q.plan[-1], answer)
        or comparison_verdict(q.question, q.plan[-1], answer)
        or (starts and comparison_verdict(q.question, q.plan[-1], answer, names=starts))
        or yes_no_verdict(q.question, q.plan[-1], answer)
        or q.plan[-1][0].get("check")  # a category comparison's (``check_categories``)
        or None
    )


def _chain_starts(plan: Sequence[Sequence[dict[str, Any]]]) -> list[str] | None:
    """Where each of a two-round plan's last steps started, in the last round's order, when each first-round
    finding leads to exactly one of them: a synthetic finding is the entity the step searches (``Bo Lee`` →
    ``Bo Lee birth year``), a real one the sentence naming it (``... directed by Jo Park`` → ``Jo Park``).
    None when the chains cannot be followed that way."""
    if len(plan) != 2 or len(plan[0]) != len(plan[1]):
        return None
    starts = []
    for step in plan[1]:
        plain = plain_title(step["sub_question"])
        leads = [
            a["sub_question"]
            for a in plan[0]
            if a.get("finding") and (step["sub_question"].startswith(a["finding"]) or mentioned(plain, a["finding"]))
        ]
        if len(leads) != 1:
            return None
        starts.append(leads[0])
    return starts if len(set(starts)) == len(starts) else None


def compare_two(a: int, b: int, wanted: str) -> str:
    """One comparison of two values spelled out digit by digit, the way a small model can check it:
    ``1914 vs 1986: after 19, 1 < 8, so 1914 is earlier.`` ``wanted``: earliest, latest, smallest or largest."""
    x, y = str(a), str(b)
    if len(x) != len(y):
        reason = f"{x if len(x) < len(y) else y} has fewer digits"
    else:
        i = next(i for i, (u, v) in enumerate(zip(x, y, strict=True)) if u != v)
        reason = (f"after {x[:i]}, " if i else "") + f"{x[i]} {'<' if x[i] < y[i] else '>'} {y[i]}"
    return f"{x} vs {y}: {reason}, so {_BETTER[wanted](a, b)} is {_COMPARATIVE[wanted]}."


_COMPARATIVE = {"earliest": "earlier", "latest": "later", "smallest": "smaller", "largest": "larger"}

#: which of two values the question's superlative keeps
_BETTER = {"earliest": min, "smallest": min, "latest": max, "largest": max}

#: comparisons of more values than this are not spelled out step by step: spelled out, the answer turn of a
#: synthetic comparison of 5 or more is often longer than the 256 tokens the policy may write
_DIGITS_UP_TO = 3


def comparison_verdict(
    question: str, steps: Sequence[dict[str, Any]], answer: str, names: Sequence[str] | None = None
) -> str | None:
    """The comparison a think turn spells out before answering, when every compared value is a number or date
    and the answer is the entity with the smallest or largest: what the question asks for, then each value
    against the best so far, digit by digit (``compare_two``; beyond ``_DIGITS_UP_TO`` values, the values listed),
    then the winner's owner: ``The question asks for
    the earliest. 1879 vs 1856: after 18, 7 > 5, so 1856 is earlier. The earliest is March 3, 1856 (Bo Lee).``
    ``names``: what each step's value belongs to, as the answer may name it (default: each step's sub-question).
    None when the values cannot be compared that way (text findings, ties, yes/no answers)."""
    values = [finding_value(s.get("finding")) for s in steps]
    if any(v is None for v in values) or len(set(values)) < len(values):
        return None
    key = normalised(answer)
    names = names or [s["sub_question"] for s in steps]
    owners = [i for i, name in enumerate(names) if key and normalised(name).startswith(key)]
    if len(owners) != 1:
        return None
    mine = values[owners[0]]
    about_time = bool(TIME_WORDS.search(question)) or any("year" in s["sub_question"] for s in steps)
    if mine == min(values):
        wanted = "earliest" if about_time else "smallest"
    elif mine == max(values):
        wanted = "latest" if about_time else "largest"
    else:
        return None
    if asked_direction(question, about_time) != wanted:  # the value read is not what the question compares
        return None  # ("Who lived longer?" read birth years), or the question says no direction
    finding = steps[owners[0]]["finding"]
    if len(values) > _DIGITS_UP_TO:
        listed = _and([str(v) for v in values])
        return f"The question asks for the {wanted}. The {wanted} of {listed} is {finding} ({answer})."
    best, compared = values[0], []
    for value in values[1:]:
        compared.append(compare_two(best, value, wanted))
        best = _BETTER[wanted](best, value)
    return f"The question asks for the {wanted}. {' '.join(compared)} The {wanted} is {finding} ({answer})."


def ranked_verdict(steps: Sequence[dict[str, Any]], answer: str) -> str | None:
    """The verdict of a ranked pair (``ps_agent.synthetic.ranked_step``): each value read, where it is stated,
    including a value stated only in the other entity's passage ("K2 ... after Mount Everest at 8,849 metres") and
    a rank stated without a value ("Mount Everest is the highest mountain on Earth"); then the two values compared
    digit by digit, or without a value the rank, which puts its entity above any other of the place it names.
    None for any other comparison."""
    if len(steps) != 2 or not all("entity" in s for s in steps):
        return None
    names = [s["entity"] for s in steps]
    if answer not in names:
        return None
    reads = []
    for step, other in zip(steps, steps[::-1], strict=True):
        if "value" in step:
            reads.append(f"{step['entity']}: {step['value']}")
        elif "value_there" in step:
            reads.append(f"{step['entity']}: {step['value_there']}, as {other['entity']}'s passage states")
        else:
            reads.append(f"{step['entity']}: no value stated, but it is {step['superlative']}")
    stated = [step.get("value") or step.get("value_there") for step in steps]
    values = [finding_value(v) for v in stated]
    mine = names.index(answer)
    if None not in values:
        if values[0] == values[1]:
            return None
        wanted = "largest" if values[mine] == max(values) else "smallest"
        decided = f"{compare_two(values[0], values[1], wanted)} The {wanted} is {stated[mine]} ({answer})."
    else:
        top, other = (steps[0], steps[1]) if values[0] is None else (steps[1], steps[0])
        wanted = "largest" if top["entity"] == answer else "smallest"
        decided = (
            f"{top['entity']} is {top['superlative']}, and {other['entity']} is in {top['place']} too, so "
            f"{top['entity']} is the larger. The {wanted} is {answer}."
        )
    return f"The values read: {'; '.join(reads)}. The question asks for the {wanted}. {decided}"


def read_values(steps: Sequence[dict[str, Any]]) -> tuple[list[str], bool, str | None]:
    """What a check compares of each step: its ``value`` where every step carries one (read as a sentence, its
    value known: ``ps_agent.synthetic``), else its finding; whether they carried one; and what they are:
    ``sentences`` (one is longer than three words), ``numbers`` (one holds a digit), ``words``, or None (one is
    missing)."""
    named = all("value" in s for s in steps)
    values = [s["value"] if named else s.get("finding") or "" for s in steps]
    if any(not v for v in values):
        return values, named, None
    if any(len(v.split()) > 3 for v in values):
        return values, named, "sentences"
    return values, named, "numbers" if any(re.search(r"\d", v) for v in values) else "words"


def yes_no_verdict(question: str, steps: Sequence[dict[str, Any]], answer: str) -> str | None:
    """The check a think turn spells out before answering yes or no, when every finding is a short value
    (a name or a word, no digits): whether the values are the same, for a question that asks so, else whether
    each is the value the question names (``Were A and B both composers?``): ``The question asks whether both
    are "composer". composer and engineer: not both.`` Steps that quote a sentence and carry its ``value``
    name each entity with it (``A: composer; B: engineer: different.``), and for a "both" question whether it is
    the one asked, ending as a real question's reading does (``A: composer, yes; B: engineer, no. Not both.``: a
    policy taught to set the two values side by side answered "musician; vocalist: not both vocalists" on real
    questions); when a finding is a quoted sentence alone, the check reads the sentences (``yes_no_reading``).
    None when the findings are dates, when the question names none of the values, or when the check does not give
    ``answer``."""
    if answer.lower() not in ("yes", "no"):
        return None
    values, named, kind = read_values(steps)
    if kind == "sentences":
        return yes_no_reading(question, steps, answer)
    if kind != "words":
        return None
    listed = (
        "; ".join(f"{s['sub_question']}: {v}" for s, v in zip(steps, values, strict=True)) if named else _and(values)
    )
    if asks_same(question):
        yes = len({normalised(v) for v in values}) == 1
        check = f"The question asks whether they are the same. {listed}: {'the same' if yes else 'different'}."
    else:
        asked = [v for v in values if re.search(rf"\b{re.escape(normalised(v))}s?\b", normalised(question))]
        if not asked:
            return None
        holds = [normalised(v) == normalised(asked[0]) for v in values]
        yes = all(holds)
        if named:  # each value, then whether it is the one asked, ending as a real question's reading does
            each = zip(steps, values, holds, strict=True)
            listed = "; ".join(f"{s['sub_question']}: {v}, {'yes' if h else 'no'}" for s, v, h in each)
            check = f'The question asks whether both are "{asked[0]}". {listed}. {"Both" if yes else "Not both"}.'
        else:  # the value quoted, not used as a noun: "both are composer" taught 4% of the gold bad grammar
            check = f'The question asks whether both are "{asked[0]}". {listed}: {"both" if yes else "not both"}.'

    return check if yes == (answer.lower() == "yes") else None


def yes_no_reading(question: str, steps: Sequence[dict[str, Any]], answer: str) -> str | None:
    """The check a think turn spells out before answering yes or no when the findings are quoted sentences
    (``read_yes_no``), or None when it does not give ``answer``: a check the passages do not bear out would teach
    guessing."""
    read = read_yes_no(question, steps)
    return read[0] if read and read[1] == (answer.lower() == "yes") else None


def read_yes_no(question: str, steps: Sequence[dict[str, Any]]) -> tuple[str, bool] | None:
    """What two quoted sentences say to a yes/no question, and whether that is yes: for "the same country /
    nationality", the country each sentence names (``Jerome Storm: United States; Andrés Wood: Chile:
    different.``); for "both <property>", whether each sentence holds every content word of the property
    (``Muzzle: yes; Screaming Trees: not stated. Not both.``). None when a name is not in the question or a
    country cannot be read. ``benchmarks/yes_no_rules.py`` measures how often each reading agrees with the train
    parts' answers."""
    names = [plain_title(s["sub_question"]) for s in steps]
    lowered = question.lower()
    if any(name.lower() not in lowered for name in names):
        return None
    if asks_same(question):
        if not re.search(r"\b(country|countries|nationality|nation)\b", question, re.IGNORECASE):
            return None
        nations = [nation_in(s["finding"]) for s in steps]
        if None in nations:
            return None
        yes = len(set(nations)) == 1
        listed = "; ".join(f"{name}: {nation}" for name, nation in zip(names, nations, strict=True))
        verdict = "the same" if yes else "different"
        return f"The question asks whether they are from the same country. {listed}: {verdict}.", yes
    end = max(lowered.index(name.lower()) + len(name) for name in names)
    tail = re.sub(r"^[\s,]*(both\s+)?", "", question[end:]).strip(" ?.")
    wanted = key_words(tail, singular=True)
    if not wanted or len(wanted) > 4:
        return None
    holds = [wanted <= key_words(s["finding"], singular=True) for s in steps]
    aux = question.split()[0].lower()
    asked = f"both {tail}" if aux in ("do", "does", "did") else f"both {aux} {tail}"
    yes = all(holds)
    listed = "; ".join(f"{name}: {'yes' if h else 'not stated'}" for name, h in zip(names, holds, strict=True))
    return f"The question asks whether {asked}. {listed}. {'Both' if yes else 'Not both'}.", yes


def title_check(q: GoldQuestion) -> str | None:
    """The check a chain's answer turn spells out when the chain ends on the entity it answers with (19% of
    HotpotQA's train chains: "Which Italian-American composer wrote the opera Maria Golovin?" searches the opera,
    then Gian Carlo Menotti): what the question asks for, as the last passage's quote says it of that entity
    (``The question asks for "Italian-American composer and librettist", and Gian Carlo Menotti's passage says
    it.``). Gold that answered with the entity it searched last and no check taught the policy to answer with an
    entity it searched, right or not. The quote is the last passage's first sentence and the one sharing most of
    the question's words (``asked_finding``). None for other chains, and where the quote shares no phrase with the
    question beyond the searched names."""
    if not ends_on_answer(q) or not q.plan[-1][0].get("asked_finding"):
        return None
    (step,) = q.plan[-1]
    title = plain_title(step["sub_question"])
    named = key_words(" ".join(s["sub_question"] for hop in q.plan[:-1] for s in hop) + f" {title}")
    phrase = asked_phrase(q.question, step["asked_finding"], named)
    return phrase and f'The question asks for "{phrase}", and {title}\'s passage says it.'


def check_chains(gold: GoldSet) -> None:
    """``gold.py --checked-chains``: each chain that ends on the entity it answers with quotes what its last
    passage says that the question asks for and checks the answer against it before answering (``title_check``),
    or is left out, counted among the skipped, where no check can be read. The shipped gold has neither."""
    kept = []
    for q in gold.questions:
        if ends_on_answer(q):
            check = title_check(q)
            if check is None:
                gold.skipped["a chain answered with the entity it searched last, unchecked (--checked-chains)"] += 1
                continue
            step = q.plan[-1][0]
            step["finding"], step["check"] = step["asked_finding"], check
        kept.append(q)
    gold.questions = kept


def category_verdict(question: str, steps: Sequence[dict[str, Any]], answer: str) -> str | None:
    """The check a think turn spells out before answering a comparison by a category, when each step's value is
    short (a word or two, no digits): for "Which of A and B was a composer?", each value and which is the one the
    question names (``The question asks which is "composer". A occupation: composer; B occupation: engineer. Only A
    is.``); for "What occupation did A and B share?", the value both have (``A: composer; B: composer. Both are
    composer.``). Where the findings are quoted sentences, ``category_reading``. None when no such check gives
    ``answer``."""
    if len(steps) != 2 or yes_no([answer]) is not None:
        return None
    values, _, kind = read_values(steps)
    if kind == "sentences":
        return category_reading(question, steps, answer)
    if kind != "words":
        return None
    listed = "; ".join(f"{s['sub_question']}: {v}" for s, v in zip(steps, values, strict=True))
    if len({normalised(v) for v in values}) == 1:
        return f"{listed}. Both are {values[0]}." if normalised(answer) == normalised(values[0]) else None
    asked = [i for i, v in enumerate(values) if re.search(rf"\b{re.escape(normalised(v))}\b", normalised(question))]
    if len(asked) != 1 or not normalised(steps[asked[0]]["sub_question"]).startswith(normalised(answer)):
        return None
    return f'The question asks which is "{values[asked[0]]}". {listed}. Only {answer} is.'


#: "Which artist is a lyricist, A or B?": what a question asks of one of two names given after it (its verb, then
#: the property), read from the text before the first name
_WHICH_PROPERTY = re.compile(
    r"^(?:which|who)\b.*?\s(is|was|are|were|has|had|have)\s+((?:an?\s+|the\s+)?.+?)[\s,:;]*$", re.IGNORECASE
)


def category_reading(question: str, steps: Sequence[dict[str, Any]], answer: str) -> str | None:
    """``category_verdict`` for quoted sentences (real questions): "Which artist is a lyricist, A or B?" asks which
    of the two sentences holds every content word of the property (``The question asks which is a lyricist. Eric
    Bloom: yes; Otep Shamaya: not stated.``). None unless exactly one does, and it is ``answer``'s: a check the
    passages do not bear out would teach guessing."""
    names = [plain_title(s["sub_question"]) for s in steps]
    lowered = question.lower()
    if any(name.lower() not in lowered for name in names):
        return None
    asked = _WHICH_PROPERTY.match(question[: min(lowered.index(name.lower()) for name in names)].strip())
    wanted = key_words(asked.group(2), singular=True) if asked else set()
    if not wanted or len(wanted) > 4:
        return None
    holds = [wanted <= key_words(s["finding"], singular=True) for s in steps]
    if holds.count(True) != 1 or not normalised(names[holds.index(True)]).startswith(normalised(answer)):
        return None
    listed = "; ".join(f"{name}: {'yes' if h else 'not stated'}" for name, h in zip(names, holds, strict=True))
    return f"The question asks which {asked.group(1).lower()} {asked.group(2)}. {listed}."


def check_categories(gold: GoldSet) -> None:
    """``gold.py --categories``: each comparison of two by a category (a synthetic one of ``--categories``'
    worlds; a real "Which artist is a lyricist, A or B?" whose passages bear one out) spells out its check before
    answering (``category_verdict``); the others stay as they are. The shipped gold has none."""
    for q in gold.questions:
        last = q.plan[-1]
        if len(last) == 2 and q.type == "comparison" and answer_verdict(q) is None:
            check = category_verdict(q.question, last, q.golden_answers[0])
            if check:
                last[0]["check"] = check


def drop_undecided_comparisons(gold: GoldSet) -> None:
    """Leave out the comparisons whose last round reads a value for every entity (a date, a number) without the
    values deciding for the gold answer: their answer turn would quote "Berkeley: 1868 and Syracuse: 1831" and then
    answer Berkeley to "Which is older?" (the passages' first dates are not always what the question compares)."""
    kept = []
    for q in gold.questions:
        last = q.plan[-1]
        valued = len(last) > 1 and all(finding_value(s.get("finding")) is not None for s in last)
        if valued and yes_no(q.golden_answers) is None and answer_verdict(q) is None:
            gold.skipped["a comparison whose values read do not decide for its answer"] += 1
            continue
        kept.append(q)
    gold.questions = kept


class TeacherPolicy:
    """A ``TextPolicy`` that writes each question's gold turns, token-exact under ``tokenizer``."""

    def __init__(self, tokenizer: Any, turns: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns

    async def acomplete(
        self, prompt: ChatPrompt, transcript: Sequence[Segment], *, stop: Sequence[str], max_tokens: int
    ) -> Completion:
        question = prompt[-1]["content"].rsplit("Question: ", 1)[1].strip()
        done = sum(segment["role"] == "model" for segment in transcript)
        text = self.turns[question][done]
        ids = text_ids(self.tokenizer, text)  # a quoted passage's special-token string stays text
        return Completion(text, prompt[-1]["content"], None, len(ids), ids, [0.0] * len(ids), "stop")
