"""Comparisons paired from the shared train parts' gold passages (``training/pairs.py``, ``gold.py --pairs``)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ps_agent.questions import SHARED_DATA, read_split, split_part
from training.gold import build_episodes, continuation_set, drawn_kind, main
from training.pairs import paired_questions, passage_kinds
from training.plans import GoldQuestion
from training.turns import answer_verdict

PEOPLE = {
    "Jo Park": "Jo Park (3 May 1901 – 9 June 1970) was an American film director and writer.",
    "Bo Lee": "Bo Lee (born 12 March 1950) is an American actor. He played in ten films.",
    "Ann Roe": "Ann Roe (1 April 1920 – 2 July 1999) was an English actress.",
    "Kim Sun": "Kim Sun (born 1962) is a South Korean film director and screenwriter.",
    "Eli Moss": "Eli Moss (born 1970) is an American film director.",
}
FILMS = {
    "Blue Moon (1955 film)": "Blue Moon is a 1955 American drama film directed by Jo Park.",
    "Red Sun": "Red Sun is a 1971 French western film.",
}


def test_a_passage_is_paired_for_what_its_lead_states():
    assert passage_kinds('"Jo Park"\n' + PEOPLE["Jo Park"]) == {"born", "died", "nationality", "occupation"}
    assert passage_kinds('"Bo Lee"\n' + PEOPLE["Bo Lee"]) == {"born", "nationality", "occupation"}  # living
    assert passage_kinds('"Blue Moon"\n' + FILMS["Blue Moon (1955 film)"]) == {"film"}
    # a film's year in parentheses is no life span, and a film dated by another date first is not paired
    assert passage_kinds('"Lola"\nLola (1955) is a romance film by the director Max Ophüls.') == set()
    assert passage_kinds('"Fog"\nShot in 1950, Fog is a 1952 British film.') == set()


def write_set(folder, passages, validation_titles=()):
    """A shared set whose train-part questions hold ``passages`` as gold; ``validation_titles`` are the gold of a
    validation-part question as well (two questions can share a gold passage)."""
    folder.mkdir(parents=True)
    ids = {title: f"p{i}" for i, title in enumerate(passages)}
    parts = {"train": [], "validation": []}
    n = 0
    for title, part in [(t, "train") for t in passages] + [(t, "validation") for t in validation_titles]:
        while split_part(f"q{n}") != part:
            n += 1
        parts[part].append({"id": f"q{n}", "question": "?", "golden_answers": ["x"], "type": "comparison",
                            "supporting_titles": [title], "supporting_doc_ids": [ids[title]]})  # fmt: skip
        n += 1
    rows = parts["train"] + parts["validation"]
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = [{"id": ids[t], "contents": f'"{t}"\n{text}'} for t, text in passages.items()]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))


def test_pairs_answer_by_the_dates_and_values_read_and_never_use_a_validation_gold_passage(tmp_path):
    write_set(tmp_path / "set", PEOPLE | FILMS | {"Eve Kay": "Eve Kay (born 1 May 1930) is an American actress."},
              validation_titles={"Eve Kay"})  # fmt: skip
    gold = paired_questions("set", per_kind=4, root=tmp_path)
    asked = Counter(kind_of(q) for q in gold.questions)
    # the pairs there are; what both name, one question per value: "film director" (of 3 pairs), "American" (of 3)
    assert asked == {"born": 4, "died": 1, "film": 1, "nationality": 4, "occupation": 4, "shared": 1, "demonym": 1}
    for q in gold.questions:
        assert "Eve Kay" not in q.question and q.source == "set-pairs" and answer_verdict(q) is not None, q
        if kind_of(q) in ("born", "died", "film"):
            assert q.golden_answers[0] in q.question
    by_question = {q.question: q.golden_answers[0] for q in gold.questions}
    died = next(q for q in by_question if "died" in q)
    assert by_question[died] == ("Jo Park" if "first" in died or "earlier" in died else "Ann Roe"), died
    film = next(q for q in by_question if "film" in q)
    assert "Blue Moon or" in film or "or Blue Moon" in film  # the title's qualifier is not in the question
    assert by_question[film] == ("Blue Moon" if any(w in film for w in ("first", "older")) else "Red Sun"), film
    yes_no = Counter(a for a in by_question.values() if a in ("yes", "no"))
    assert yes_no == {"yes": 4, "no": 4}, yes_no  # half of each yes/no kind


def kind_of(q: GoldQuestion) -> str:
    return q.id.split("-pair-")[1].rsplit("-", 1)[0]


def test_what_both_share_is_asked_where_the_leads_name_exactly_one_value_in_common(tmp_path):
    """The one profession, sport or demonym both first sentences name, checked before answering; pairs that name
    "director" beside "film director", or an "Italian-American", are not asked."""
    people = {
        "Al Voss": "Al Voss (born 1950) is an American actor and film director.",
        "Cy Ward": "Cy Ward (born 1960) is an American actor and director.",  # director or film director: not asked
        "Di Hale": "Di Hale (born 1970) is an Italian-American actor.",
        "Ed Ross": "Ed Ross (born 1940) is an English tennis player.",
        "Fi Kerr": "Fi Kerr (born 1945) is an English tennis player and coach.",
    }
    write_set(tmp_path / "set", people)
    gold = paired_questions("set", per_kind=6, root=tmp_path)
    shared = {frozenset(s["sub_question"] for s in q.plan[0]): q for q in gold.questions if kind_of(q) == "shared"}
    assert set(shared) == {frozenset(("Al Voss", "Di Hale")), frozenset(("Cy Ward", "Di Hale")),
                           frozenset(("Ed Ross", "Fi Kerr"))}, set(shared)  # fmt: skip
    tennis = shared[frozenset(("Ed Ross", "Fi Kerr"))]
    assert tennis.golden_answers == ["tennis"] and "sport" in tennis.question, tennis
    assert {q.golden_answers[0] for q in shared.values()} == {"actor", "tennis"}
    assert answer_verdict(tennis).endswith("Both: tennis player."), answer_verdict(tennis)
    nations = {(q.golden_answers[0], *sorted(s["sub_question"] for s in q.plan[0]))
               for q in gold.questions if kind_of(q) == "demonym"}  # fmt: skip
    assert nations == {("American", "Al Voss", "Cy Ward"), ("English", "Ed Ross", "Fi Kerr")}, nations

    italians = {"Gi Moro": "Gi Moro (born 1950) is an Italian-American singer.",
                "Ho Bini": "Ho Bini (born 1960) is an Italian painter."}  # fmt: skip
    write_set(tmp_path / "italians", italians)
    assert not [q for q in paired_questions("italians", 6, root=tmp_path).questions if kind_of(q) == "demonym"]


def test_one_pair_of_each_kind_is_made_when_one_is_asked_for(tmp_path):
    write_set(tmp_path / "set", PEOPLE | FILMS)
    kinds = Counter(kind_of(q) for q in paired_questions("set", per_kind=1, root=tmp_path).questions)
    assert kinds == {k: 1 for k in ("born", "died", "film", "nationality", "occupation", "shared", "demonym")}, kinds


def test_a_missing_shared_set_is_counted_not_raised(tmp_path):
    gold = paired_questions("absent", per_kind=3, root=tmp_path)
    assert gold.questions == [] and sum(gold.skipped.values()) == 1, gold.skipped


def test_pairs_over_the_shared_train_parts_ask_both_ways_and_answer_either_name():
    """Over real leads: every kind is made, both the first and the second name are answers (a policy that copies
    the first name scores half), no gold passage of a validation question is read, and each is checked."""
    held_out = {
        i for r in read_split(SHARED_DATA / "hotpotqa/dev.jsonl", "validation") for i in r["supporting_doc_ids"]
    }
    gold = paired_questions("hotpotqa", per_kind=40)
    kinds = Counter(kind_of(q) for q in gold.questions)
    assert kinds == {k: 40 for k in ("born", "died", "film", "nationality", "occupation", "shared")} | {"demonym": 22}
    for kind in ("shared", "demonym"):  # no value answers more than a third of a kind: not every one "American"
        values = Counter(q.golden_answers[0] for q in gold.questions if kind_of(q) == kind)
        assert len(values) >= 4 and max(values.values()) <= 13, values
    named = [q for q in gold.questions if kind_of(q) in ("born", "died", "film")]
    first = sum(q.question.split(", ", 1)[-1].startswith(q.golden_answers[0]) for q in named)
    assert 0.3 < first / len(named) < 0.7, first
    assert not {s["passage_id"] for q in gold.questions for s in q.plan[0]} & held_out
    assert all(answer_verdict(q) is not None for q in gold.questions)


def test_a_pairs_continuation_set_draws_pairs_beside_capped_others(capsys):
    steps = [{"sub_question": "A", "finding": "1901"}, {"sub_question": "B", "finding": "1950"}]
    questions = [
        *(GoldQuestion(f"p{i}", "Who was born first, A or B?", ["A"], "comparison", [steps], "hotpotqa-pairs", "c")
          for i in range(5)),
        *(GoldQuestion(f"r{i}", "Who is older, A or B?", ["A"], "comparison", [steps], "hotpotqa", "c")
          for i in range(5)),
    ]  # fmt: skip
    assert {drawn_kind(q) for q in questions} == {"pair", None}
    episodes = [{"id": q.id, "source": q.source, "question_class": "parallelisable"} for q in questions]
    kept = [ep["id"] for ep in continuation_set(episodes, {q.id: q for q in questions}, {"pair": 3}, cap=2)]
    assert sum(i.startswith("p") for i in kept) == 3 and sum(i.startswith("r") for i in kept) == 2, kept
    with pytest.raises(SystemExit):
        main(["--pairs-drawn", "5"])
    assert "--pairs 0 --pairs-drawn 5: expected counts >= 0, drawn from --pairs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--pairs", "5", "--pair-kinds", "born,height"])
    assert "--pair-kinds born,height: expected some of born,died,film," in capsys.readouterr().err


def test_pairs_are_made_of_the_kinds_asked_for(tmp_path):
    write_set(tmp_path / "set", PEOPLE | FILMS)
    gold = paired_questions("set", per_kind=4, root=tmp_path, kinds=("film", "shared"))
    assert Counter(kind_of(q) for q in gold.questions) == {"film": 1, "shared": 1}


def test_paired_questions_become_gold_episodes_that_read_both_leads_and_check_before_answering(smollm2_path):
    """Through the real graph over HotpotQA's corpus: each pair searches both names in one round, retrieves both
    gold passages, and spells out its check before the answer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    gold = paired_questions("hotpotqa", per_kind=2)
    episodes, skipped = build_episodes(gold.questions, "parallel", tokenizer, max_length=4096)
    # two of each kind but the demonyms: a value answers a third of its kind at most, so one "American"
    assert len(episodes) + sum(skipped.values()) == 13 and len(episodes) >= 11, skipped
    for ep in episodes:
        text = tokenizer.decode(ep["completion_ids"])
        assert text.count("<search>") == 1 and " ## " in text.split("<search>")[1].split("</search>")[0], text
        answer_turn = text.rsplit("</information>", 1)[1]
        assert "The question asks" in answer_turn and "<answer>" in answer_turn, answer_turn


def test_a_gold_passage_of_a_validation_question_is_never_paired(tmp_path):
    """Three people of train questions, one of them gold of a validation question too: of the three pairs only the
    one without it is asked."""
    people = {t: PEOPLE[t] for t in ("Jo Park", "Bo Lee")} | {"Eve Kay": "Eve Kay (born 1 May 1930) is an actress."}
    write_set(tmp_path / "set", people, validation_titles={"Eve Kay"})
    born = [q for q in paired_questions("set", per_kind=10, root=tmp_path).questions if "-pair-born-" in q.id]
    assert len(born) == 1 and "Eve Kay" not in born[0].question, [q.question for q in born]
