"""Gold trajectories (``training/gold.py`` and the modules it reads: ``plans``, ``reading``, ``turns``): plans from
supporting titles, the teacher's turns, and episodes that are exactly the
tokens an RL rollout of the same text conditions on, with the loss on the model's turns only."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest

from ps_agent import ParallelSearchAgent
from ps_agent.llms import context_ids
from ps_agent.protocol import is_well_formed_turn, parse_action
from ps_agent.questions import question_class, split_part
from ps_agent.synthetic import generate
from training.gold import (
    build_episodes,
    capped,
    continuation_set,
    episode,
    left_out,
    main,
    summary,
    unchecked_yes_no,
)
from training.plans import (
    WORLD_ENTITIES,
    WORLD_PER_FAMILY,
    GoldQuestion,
    GoldSet,
    plan_from_titles,
    restore_corpora,
    shared_questions,
)
from training.reading import asked_date, asked_phrase, first_date, quote
from training.run_sft import sft_example
from training.turns import (
    TeacherPolicy,
    category_verdict,
    check_categories,
    check_chains,
    compare_two,
    comparison_verdict,
    drop_undecided_comparisons,
    ranked_verdict,
    teacher_turns,
    yes_no_verdict,
)


def record(qtype, question, titles):
    return {
        "question": question,
        "type": qtype,
        "supporting_titles": titles,
        "supporting_doc_ids": [f"id-{t}" for t in titles],
    }


def subs(plan):
    return [[step["sub_question"] for step in r] for r in plan]


@pytest.mark.parametrize(
    ("rec", "passages", "expected"),
    [
        (record("comparison", "Is A older than B (band)?", ["A", "B (band)"]), {}, [["A", "B (band)"]]),
        # the question names the first hop
        (record("bridge", "Who directed Unbreakable?", ["David Dunn", "Unbreakable (film)"]), {},
         [["Unbreakable (film)"], ["David Dunn"]]),
        # both named: the passage that names the other comes first
        (record("compositional", "Where was Father, the parent of Son, born?", ["Father", "Son"]),
         {"id-Son": "Son is the child of Father.", "id-Father": "Father was born in Y."}, [["Son"], ["Father"]]),
        # a Wikipedia qualifier is searched only where the question or the passage read before says it
        (record("bridge", "Where did the director of the film Passport die?",
                ["Passport (film)", "Mal Clair (filmmaker)"]),
         {"id-Passport (film)": "Passport is a film directed by Mal Clair.", "id-Mal Clair (filmmaker)": "He died."},
         [["Passport (film)"], ["Mal Clair"]]),
        (record("bridge", "Where did the director of Passport die?", ["Passport (novel)", "Mal Clair (filmmaker)"]),
         {"id-Passport (novel)": "Passport is a novel filmed by filmmaker Mal Clair.", "id-Mal Clair (filmmaker)": "."},
         [["Passport"], ["Mal Clair (filmmaker)"]]),
        (record("bridge_comparison", "Whose director was born first, Film A or Film B?",
                ["Film A", "Dir A", "Film B", "Dir B"]), {}, [["Film A", "Film B"], ["Dir A", "Dir B"]]),
        (record("3hop1", "q", ["P", "Q", "R"]), {}, [["P"], ["Q"], ["R"]]),
    ],
)  # fmt: skip
def test_plans_follow_from_supporting_titles(rec, passages, expected):
    assert subs(plan_from_titles(rec, passages)) == expected


@pytest.mark.parametrize(
    ("rec", "reason"),
    [
        (record(None, "q", []), "no supporting titles"),
        (record("bridge", "Who is it?", ["A", "B"]), "hop order not derivable"),
        (record("comparison", "A, B or C?", ["A", "B", "C"]), "comparison without two supporting titles"),
        (record("bridge", "q", ["A", "A"]), "repeated supporting title"),
    ],
)
def test_questions_without_a_derivable_plan_say_why(rec, reason):
    assert plan_from_titles(rec, {}).startswith(reason)


def test_a_chain_that_starts_from_an_entity_the_question_does_not_name_is_left_out():
    """51 real episodes searched first a title the question never names ("When was the English rock band formed
    that's first recording remained unreleased?" → ``<search> On Parole </search>``): made-up first hops."""
    rec = record("compositional", "Where was the parent of X born?", ["Father", "Son"])
    passages = {"id-Son": "Son is the child of Father.", "id-Father": "Father was born in Y."}
    assert (
        plan_from_titles(rec, passages)
        == "a round's entity is named neither in the question nor in what was read before it"
    )


def test_comparison_findings_quote_each_passages_date_when_the_question_is_about_time():
    rec = record("comparison", "Who was born first, Ann Roe or Bo Lee?", ["Ann Roe", "Bo Lee"])
    passages = {
        "id-Ann Roe": '"Ann Roe"\nAnn Roe (born 14 March 1879 in Ulm) was a physicist. She moved in 1900.',
        "id-Bo Lee": '"Bo Lee"\nBo Lee (March 3, 1856 – 1920) was a painter.',
    }
    rec["golden_answers"] = ["Bo Lee"]
    plan = plan_from_titles(rec, passages)
    assert [s["finding"] for s in plan[0]] == ["14 March 1879", "March 3, 1856"]
    assert comparison_verdict(rec["question"], plan[0], "Bo Lee") == (
        "The question asks for the earliest. 1879 vs 1856: after 18, 7 > 5, so 1856 is earlier. The earliest is "
        "March 3, 1856 (Bo Lee)."
    )
    q = GoldQuestion("c", rec["question"], ["Bo Lee"], "comparison", plan, "hotpotqa", "corpus.jsonl")
    answer_turn = teacher_turns(q, "parallel", random.Random(0))[-1]
    assert "Ann Roe: 14 March 1879" in answer_turn and "The earliest is" in answer_turn
    assert answer_turn.endswith("<answer> Bo Lee </answer>")


def test_comparison_findings_add_the_sentence_that_holds_what_the_question_asks_about():
    question = "Which mosque is unique for retaining a Baroque style, the Nur Mosque or the Ada Mosque?"
    rec = record("comparison", question, ["Nur Mosque", "Ada Mosque"])
    passages = {
        "id-Nur Mosque": '"Nur Mosque"\nThe Nur Mosque is a mosque in Istanbul. It has two minarets.',
        "id-Ada Mosque": '"Ada Mosque"\nAda Mosque is an ornate mosque. Its dome is wide. It retains a Baroque style.',
    }
    rec["golden_answers"] = ["Ada Mosque"]
    plan = plan_from_titles(rec, passages)
    assert [s["finding"] for s in plan[0]] == [
        "The Nur Mosque is a mosque in Istanbul",  # no other sentence shares the question's words
        "Ada Mosque is an ornate mosque; It retains a Baroque style",
    ]
    q = GoldQuestion("c", question, ["Ada Mosque"], "comparison", plan, "hotpotqa", "corpus.jsonl")
    assert "Baroque style" in teacher_turns(q, "parallel", random.Random(0))[-1]


def test_a_verdict_is_spelled_out_only_for_comparable_values_owned_by_the_answer():
    steps = [{"sub_question": "A city population", "finding": "120000"}, {"sub_question": "B city population",
             "finding": "95000"}]  # fmt: skip
    question = "Which city has more inhabitants, A or B?"
    assert comparison_verdict(question, steps, "A").endswith("so 120000 is larger. The largest is 120000 (A).")
    assert comparison_verdict(question, steps, "B") is None  # "more", but B owns the fewer: no check says so
    fewer = "Which city has fewer inhabitants, A or B?"
    assert comparison_verdict(fewer, steps, "B").endswith("so 95000 is smaller. The smallest is 95000 (B).")
    assert comparison_verdict("Are A and B both cities?", steps, "yes") is None  # no entity owns a yes
    texts = [{"sub_question": "A", "finding": "A is a town founded in 1200 by monks"}, {"sub_question": "B",
             "finding": "B is a village"}]  # fmt: skip
    assert comparison_verdict("Which is older, A or B?", texts, "A") is None  # sentences are quoted, not compared


def test_a_synthetic_hybrid_asking_for_the_chains_start_names_the_start_in_its_verdict():
    plan = [
        [{"sub_question": "The Vorth Tide creator", "finding": "Bo Lee"},
         {"sub_question": "Kest Works founder", "finding": "Ada Roe"}],
        [{"sub_question": "Bo Lee birth year", "finding": "1957"},
         {"sub_question": "Ada Roe birth year", "finding": "1985"}],
    ]  # fmt: skip
    question = "Which work has the creator born first, The Vorth Tide or Kest Works?"
    q = GoldQuestion("h", question, ["The Vorth Tide"], "hybrid", plan, "synthetic", "c")
    last = teacher_turns(q, "parallel", random.Random(0))[-1]
    assert "1957 vs 1985: after 19, 5 < 8, so 1957 is earlier. The earliest is 1957 (The Vorth Tide)." in last
    plan[1].reverse()  # the people in the other order: each year still follows its chain back to its work
    last = teacher_turns(q, "parallel", random.Random(0))[-1]
    assert "1985 vs 1957: after 19, 8 > 5, so 1957 is earlier. The earliest is 1957 (The Vorth Tide)." in last
    plan[0][0]["finding"] = "Cy Doe"  # a chain that leads nowhere: which work a year belongs to is not known
    last = teacher_turns(q, "parallel", random.Random(0))[-1]
    assert "vs" not in last and "The Vorth Tide" in last


def test_a_real_hybrid_compares_the_dates_the_question_asks_for_and_names_the_film():
    question = "Which film has the director who died earlier, Blue Moon or Red Sun?"
    rec = record("bridge_comparison", question, ["Blue Moon", "Jo Park", "Red Sun", "Al Kim"])
    rec["golden_answers"] = ["Red Sun"]  # a film: written in the first round's passages, not in the directors'
    passages = {
        "id-Blue Moon": '"Blue Moon"\nBlue Moon is a 1950 film. It was directed by Jo Park.',
        "id-Red Sun": '"Red Sun"\nRed Sun is a 1931 film directed by Al Kim and starring Bo Lee.',
        "id-Jo Park": '"Jo Park"\nJo Park (3 May 1901 – 9 June 1970) was a director.',
        "id-Al Kim": '"Al Kim"\nAl Kim( March 1, 1905 - 1962) was a director.',  # born later, died earlier
    }
    plan = plan_from_titles(rec, passages)
    assert [s["finding"] for s in plan[1]] == ["9 June 1970", "1962"]
    q = GoldQuestion("r", question, ["Red Sun"], "bridge_comparison", plan, "2wikimultihopqa", "c")
    last = teacher_turns(q, "parallel", random.Random(0))[-1]
    assert "1970 vs 1962: after 19, 7 > 6, so 1962 is earlier. The earliest is 1962 (Red Sun)." in last
    assert asked_date(passages["id-Jo Park"], "Which director was born first?") == "3 May 1901"
    assert asked_date('"T"\nTo Li (born 1950) is a director.', "Who died first?") is None  # no death date read
    assert asked_date('"Die Hard"\nDie Hard is a 1988 film.', "Which came out first, Die Hard or Jaws?") == "1988"


def test_real_hybrids_are_kept_when_the_answer_is_one_of_the_compared_entities(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    row = {"id": "q1", "question": "Which film has the director born first, Blue Moon or Red Sun?",
           "golden_answers": ["Blue Moon"], "type": "bridge_comparison",
           "supporting_titles": ["Blue Moon", "Jo Park", "Red Sun", "Al Kim"],
           "supporting_doc_ids": ["p1", "p2", "p3", "p4"]}  # fmt: skip
    corpus = [
        {"id": "p1", "contents": '"Blue Moon"\nBlue Moon was directed by Jo Park.'},
        {"id": "p2", "contents": '"Jo Park"\nJo Park (born 1901) is a director.'},
        {"id": "p3", "contents": '"Red Sun"\nRed Sun was directed by Al Kim.'},
        {"id": "p4", "contents": '"Al Kim"\nAl Kim (born 1905) is a director.'},
    ]
    (folder / "dev.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    assert split_part("q1") == "train"
    gold = shared_questions("set", root=tmp_path)
    assert [subs(q.plan) for q in gold.questions] == [[["Blue Moon", "Red Sun"], ["Jo Park", "Al Kim"]]]
    row["golden_answers"] = ["Green Sky"]  # in none of them
    (folder / "dev.jsonl").write_text(json.dumps(row) + "\n")
    assert shared_questions("set", root=tmp_path).skipped == {
        "set: the answer is not in the compared entities' passages": 1
    }


def test_each_value_is_compared_with_the_best_so_far_digit_by_digit():
    """Issue 25: the shipped policy quoted both dates right and then named the wrong one; the verdict now
    decides one digit at a time, against the best value so far."""
    assert compare_two(1914, 1986, "earliest") == "1914 vs 1986: after 19, 1 < 8, so 1914 is earlier."
    assert compare_two(1986, 1914, "latest") == "1986 vs 1914: after 19, 8 > 1, so 1986 is later."
    assert compare_two(8611, 12000, "largest") == "8611 vs 12000: 8611 has fewer digits, so 12000 is larger."
    assert compare_two(305, 401, "smallest") == "305 vs 401: 3 < 4, so 305 is smaller."
    steps = [{"sub_question": f"{name} founded", "finding": year} for name, year in
             (("A", "1801"), ("B", "1756"), ("C", "1823"))]  # fmt: skip
    verdict = comparison_verdict("Which city was founded earliest: A, B or C?", steps, "B")
    assert verdict == (
        "The question asks for the earliest. 1801 vs 1756: after 1, 8 > 7, so 1756 is earlier. 1756 vs 1823: "
        "after 1, 7 < 8, so 1756 is earlier. The earliest is 1756 (B)."
    )
    wide = [*steps, {"sub_question": "D founded", "finding": "1790"}]  # steps of four would not fit in one turn
    assert comparison_verdict("Which city was founded earliest: A, B, C or D?", wide, "B") == (
        "The question asks for the earliest. The earliest of 1801, 1756, 1823 and 1790 is 1756 (B)."
    )


def test_values_with_units_are_compared_digit_by_digit_in_the_direction_the_answer_says():
    heights = [{"sub_question": "Ann Roe height", "finding": "183 cm"}, {"sub_question": "Bo Lee height",
               "finding": "175 cm"}]  # fmt: skip
    assert comparison_verdict("Who is taller: Ann Roe or Bo Lee?", heights, "Ann Roe") == (
        "The question asks for the largest. 183 vs 175: after 1, 8 > 7, so 183 is larger. The largest is 183 cm "
        "(Ann Roe)."
    )
    assert comparison_verdict("Who is shorter: Ann Roe or Bo Lee?", heights, "Bo Lee").endswith("175 cm (Bo Lee).")
    areas = [dict(heights[0], finding="1,250 square kilometres"), dict(heights[1], finding="980 square kilometres")]
    assert "980 has fewer digits" in comparison_verdict("Which covers less land: Ann Roe or Bo Lee?", areas, "Bo Lee")
    tall = [dict(heights[0], finding="183 cm tall"), heights[1]]  # a sentence, not a value
    assert comparison_verdict("Who is taller: Ann Roe or Bo Lee?", tall, "Ann Roe") is None


def test_a_yes_no_answer_follows_a_check_of_the_two_values():
    """Issue 25: the shipped policy answered every yes/no comparison "yes"; its gold had no yes/no check."""
    jobs = [{"sub_question": "A occupation", "finding": "composer"}, {"sub_question": "B occupation",
            "finding": "engineer"}]  # fmt: skip
    assert yes_no_verdict("Were A and B both composers?", jobs, "no") == (
        'The question asks whether both are "composer". composer and engineer: not both.'
    )
    assert yes_no_verdict("Did A and B have the same occupation?", jobs, "no") == (
        "The question asks whether they are the same. composer and engineer: different."
    )
    same = [dict(jobs[0]), dict(jobs[1], finding="Composer")]
    assert yes_no_verdict("Were A and B both composers?", same, "yes").endswith("composer and Composer: both.")
    assert yes_no_verdict("Did A and B have the same occupation?", same, "yes").endswith(": the same.")
    assert yes_no_verdict("Did A and B have the same occupation?", jobs, "yes") is None  # the check says no
    assert yes_no_verdict("Were A and B both sculptors?", jobs, "no") is None  # the question names neither value
    assert yes_no_verdict("Which one was a composer, A or B?", jobs, "A") is None  # not a yes/no answer
    dates = [dict(jobs[0], finding="1879"), dict(jobs[1], finding="1879")]
    assert yes_no_verdict("Were A and B born in the same year?", dates, "yes") is None  # dates are compared otherwise
    quoted = [dict(jobs[0], finding="A was an English composer of operas"), jobs[1]]
    assert yes_no_verdict("Were A and B both composers?", quoted, "no") is None  # a sub-question the question lacks


def test_a_yes_no_pair_read_as_sentences_names_each_entity_with_the_value_its_sentence_states():
    jobs = [{"sub_question": "Ab Cd", "finding": "Ab Cd (born 1801 in Tamsk) was a composer", "value": "composer"},
            {"sub_question": "Ef Gh", "finding": "Ef Gh was an engineer", "value": "engineer"}]  # fmt: skip
    assert yes_no_verdict("Were Ab Cd and Ef Gh both composers?", jobs, "no") == (
        'The question asks whether both are "composer". Ab Cd: composer, yes; Ef Gh: engineer, no. Not both.'
    )
    both = [jobs[0], dict(jobs[1], value="Composer")]
    assert yes_no_verdict("Were Ab Cd and Ef Gh both composers?", both, "yes").endswith(
        "Ab Cd: composer, yes; Ef Gh: Composer, yes. Both."
    )
    assert yes_no_verdict("Did Ab Cd and Ef Gh have the same occupation?", jobs, "no").endswith(
        "Ab Cd: composer; Ef Gh: engineer: different."
    )
    assert yes_no_verdict("Did Ab Cd and Ef Gh have the same occupation?", jobs, "yes") is None  # the check says no


def test_a_comparison_by_a_category_reads_each_value_and_answers_with_the_one_asked_or_the_one_shared():
    """The retrain at step 140 and 250 compared birth years for "Which artist is a lyricist, Eric Bloom or Otep
    Shamaya?": a third of HotpotQA's named comparisons pick by a category, which no synthetic question did and no
    gold answer turn checked (docs/results.md, 2026-11-30, second)."""
    jobs = [{"sub_question": "A occupation", "finding": "composer"}, {"sub_question": "B occupation",
            "finding": "engineer"}]  # fmt: skip
    assert category_verdict("Which of A and B was a composer?", jobs, "A") == (
        'The question asks which is "composer". A occupation: composer; B occupation: engineer. Only A is.'
    )
    assert category_verdict("Which of A and B was a composer?", jobs, "B") is None  # the check says A
    assert category_verdict("Which of A and B was a sculptor?", jobs, "A") is None  # the question names neither
    shared = [jobs[0], dict(jobs[1], finding="composer")]
    assert category_verdict("What occupation did A and B share?", shared, "composer").endswith("Both are composer.")
    assert category_verdict("What occupation did A and B share?", jobs, "composer") is None  # they share none
    assert category_verdict("Were A and B both composers?", shared, "yes") is None  # a yes/no: yes_no_verdict's
    years = [dict(jobs[0], finding="1879"), dict(jobs[1], finding="1901")]
    assert category_verdict("Which of A and B was born in 1879?", years, "A") is None  # numbers: compared otherwise
    bands = [{"sub_question": "Eric Bloom", "finding": "Eric Bloom is an American lyricist and guitarist"},
             {"sub_question": "Otep Shamaya", "finding": "Otep Shamaya is the lead vocalist of Otep"}]  # fmt: skip
    assert category_verdict("Which artist is a lyricist, Eric Bloom or Otep Shamaya?", bands, "Eric Bloom") == (
        "The question asks which is a lyricist. Eric Bloom: yes; Otep Shamaya: not stated."
    )
    both = [bands[0], dict(bands[1], finding="Otep Shamaya is a lyricist")]
    assert category_verdict("Which artist is a lyricist, Eric Bloom or Otep Shamaya?", both, "Eric Bloom") is None
    assert category_verdict("Which artist is a lyricist, Eric Bloom or Otep Shamaya?", bands, "Otep Shamaya") is None


def test_category_comparisons_of_a_world_built_with_them_each_check_before_answering(tmp_path):
    """``gold.py --categories``: every category comparison of a world gets its check (the pair read as bare values
    or, in a ranked world, as sentences), the check gives the gold answer, and a world without the flag has the
    same questions it had, in the same order, and none of these."""
    _, plain = generate(seed=7, entities=150, out=tmp_path / "plain", ranked=True)
    _, with_them = generate(seed=7, entities=150, out=tmp_path / "categories", ranked=True, categories=True)
    before = plain.read_text().splitlines()
    rows = [json.loads(line) for line in with_them.read_text().splitlines()]
    assert with_them.read_text().splitlines()[: len(before)] == before
    categories = [q for q in rows[len(before) :] if q["family"] == "category"]
    assert len(categories) == len(rows) - len(before) >= 8
    assert {"value" in q["plan"][0][0] for q in categories} == {True, False}  # read as sentences and as values
    gold = GoldSet([GoldQuestion(q["id"], q["question"], q["golden_answers"], q["type"], q["plan"], "synthetic", "c")
                    for q in categories])  # fmt: skip
    check_categories(gold)
    kinds = Counter()
    for q in gold.questions:
        last = teacher_turns(q, "parallel", random.Random(0))[-1]
        kinds["which" if "Only" in last else "shared" if "Both are" in last else None] += 1
        answer = q.golden_answers[0]
        assert last.endswith(f"So the answer is {answer}. </think>\n<answer> {answer} </answer>"), last
    assert kinds["which"] >= 4 and kinds["shared"] >= 4 and kinds[None] == 0, kinds


def test_every_yes_no_pair_read_as_sentences_in_a_ranked_world_gets_its_check(tmp_path):
    """The gold of the next retrain (``gold.py --ranked``): each answer turn of a yes/no pair searched by the bare
    names spells out its check, naming both entities, and the check gives the gold answer."""
    _, path = generate(seed=7, entities=150, out=tmp_path, ranked=True)
    yes_no = [q for q in map(json.loads, path.read_text().splitlines()) if q["family"] == "yes-no"]
    named = [q for q in yes_no if "value" in q["plan"][0][0]]
    assert named
    for q in named:
        gold = GoldQuestion(q["id"], q["question"], q["golden_answers"], q["type"], q["plan"], "synthetic", "c")
        last = teacher_turns(gold, "parallel", random.Random(0))[-1]
        a, b = (s["sub_question"] for s in q["plan"][0])
        assert "The question asks whether" in last and f"{a}: " in last and f"; {b}: " in last, last
        assert last.endswith(f"<answer> {q['golden_answers'][0]} </answer>"), last


def test_the_summary_counts_real_yes_no_episodes_by_answer_and_by_whether_they_spell_out_a_check():
    bands = [{"sub_question": "Muzzle (band)", "finding": "Muzzle is an alternative rock band formed in 1994"},
             {"sub_question": "Screaming Trees", "finding": "Screaming Trees was an American rock band"}]  # fmt: skip
    asked = "Are Muzzle and Screaming Trees both alternative rock bands?"
    questions = [
        GoldQuestion("checked", asked, ["no"], "comparison", [bands], "hotpotqa", "c"),
        GoldQuestion("unchecked", asked, ["yes"], "comparison", [bands], "hotpotqa", "c"),  # the reading says no
        GoldQuestion("dropped", asked, ["yes"], "comparison", [bands], "hotpotqa", "c"),  # no episode was kept
        GoldQuestion("named", "Which is older?", ["Muzzle"], "comparison", [bands], "hotpotqa", "c"),
        GoldQuestion("synthetic", "Are A and B both x?", ["no"], "comparison", [bands], "synthetic", "c"),
    ]
    episodes = [
        {"id": q.id, "source": q.source, "question_class": "parallelisable", "prompt_ids": [1], "completion_ids": [2],
         "env_mask": [1]}
        for q in questions if q.id != "dropped"
    ]  # fmt: skip
    report = summary(GoldSet(questions), episodes, Counter(), len(episodes))
    assert report["real_yes_no"] == {"yes": 1, "no": 1, "with_check": 1}


def test_the_summary_counts_real_chains_that_end_on_their_answer_and_those_checked():
    passage = "Gian Carlo Menotti (1911 – 2007) was an Italian-American composer and librettist."
    questions = [
        opera_chain(
            "Which Italian-American composer and librettist wrote Maria Golovin?", "Gian Carlo Menotti", passage
        ),
        opera_chain("Which composer wrote Maria Golovin?", "Gian Carlo Menotti", passage),  # no phrase to check
        opera_chain("When was the composer of Maria Golovin born?", "1911", passage),  # ends on a value
    ]
    for i, q in enumerate(questions):
        q.id = f"q{i}"

    def report(gold):
        episodes = [{"id": q.id, "source": "hotpotqa", "question_class": "sequential", "prompt_ids": [1],
                     "completion_ids": [2], "env_mask": [1]} for q in gold.questions]  # fmt: skip
        return summary(gold, episodes, Counter(), len(episodes))["real_ends_on_answer"]

    assert report(GoldSet(list(questions))) == {"chains": 2, "checked": 0}  # the shipped gold's form
    checked = GoldSet(list(questions))
    check_chains(checked)
    assert report(checked) == {"chains": 1, "checked": 1}


def stub_episodes(questions: list[GoldQuestion]) -> list[dict]:
    """Test double: one token-less episode per question, with its source and class, for the selection and the
    summary."""
    return [
        {"id": q.id, "source": q.source, "question_class": question_class(q.type), "prompt_ids": [1],
         "completion_ids": [2], "env_mask": [1]}
        for q in questions
    ]  # fmt: skip


def test_a_yes_no_continuation_set_draws_as_many_checked_no_as_yes_the_shared_sets_first_beside_capped_others(capsys):
    """Issue 25: the default policy answers yes to most questions whose answer is no; ``--yes-no N`` draws N/2 of
    each, never an unchecked one, and caps the rest by source and class as a rehearsal of what it knew."""
    bands = [{"sub_question": "Muzzle (band)", "finding": "Muzzle is an alternative rock band formed in 1994"},
             {"sub_question": "Screaming Trees", "finding": "Screaming Trees was an American rock band"}]  # fmt: skip
    same = [{"sub_question": "A", "value": "composer"}, {"sub_question": "B", "value": "composer"}]
    differ = [same[0], {"sub_question": "B", "value": "engineer"}]
    asked = "Are Muzzle and Screaming Trees both alternative rock bands?"
    questions = [
        GoldQuestion("real-no", asked, ["no"], "comparison", [bands], "hotpotqa", "c"),
        GoldQuestion("real-unchecked", asked, ["yes"], "comparison", [bands], "hotpotqa", "c"),
        *(GoldQuestion(f"syn-yes-{i}", "Are A and B both composers?", ["yes"], "comparison", [same], "synthetic", "c")
          for i in range(3)),
        *(GoldQuestion(f"syn-no-{i}", "Are A and B both composers?", ["no"], "comparison", [differ], "synthetic", "c")
          for i in range(3)),
        *(GoldQuestion(f"named-{i}", "Which is older?", ["A"], "comparison", [bands], "hotpotqa", "c")
          for i in range(5)),
        *(GoldQuestion(f"bridge-{i}", "Who?", ["C"], "bridge", [bands[:1]], "synthetic", "c") for i in range(5)),
    ]  # fmt: skip
    episodes = stub_episodes(questions)
    by_id = {q.id: q for q in questions}

    assert [q.id for q in questions if unchecked_yes_no(q)] == ["real-unchecked"]  # what --checked-yes-no drops
    kept = [ep["id"] for ep in continuation_set(episodes, by_id, {"yes": 2, "no": 2}, cap=3)]
    assert "real-no" in kept and "real-unchecked" not in kept  # the shared sets' checked one first; no unchecked
    answers = Counter(by_id[i].golden_answers[0] for i in kept)
    assert answers["yes"] == 2 and answers["no"] == 2, answers
    assert sum(i.startswith("named-") for i in kept) == 3 and sum(i.startswith("bridge-") for i in kept) == 3
    assert len(continuation_set(episodes, by_id, {"yes": 2, "no": 2}, cap=None)) == 4 + 10  # uncapped: all others
    report = summary(GoldSet(questions), [e for e in episodes if e["id"] in kept], Counter(), len(kept))
    assert report["yes_no"] == {"yes": 2, "no": 2}
    with pytest.raises(SystemExit):
        main(["--yes-no", "3"])
    assert "--yes-no 3: expected an even count" in capsys.readouterr().err


def test_a_category_continuation_set_draws_checked_category_comparisons_the_shared_sets_first(capsys):
    """``--categories-drawn N``: N comparisons by a category that check before answering, the shared sets' first,
    beside the others capped by source and class (an unchecked yes/no among them: only drawing yes/no leaves those
    out)."""
    jobs = [{"sub_question": "A occupation", "finding": "composer"},
            {"sub_question": "B occupation", "finding": "engineer"}]  # fmt: skip
    bands = [{"sub_question": "Eric Bloom", "finding": "Eric Bloom is an American lyricist"},
             {"sub_question": "Otep Shamaya", "finding": "Otep Shamaya is the singer of Otep"}]  # fmt: skip
    lyricist = "Which artist is a lyricist, Eric Bloom or Otep Shamaya?"
    questions = [
        GoldQuestion("real-category", lyricist, ["Eric Bloom"], "comparison", [bands], "hotpotqa", "c"),
        GoldQuestion("real-unchecked", "Are both bands?", ["yes"], "comparison", [bands], "hotpotqa", "c"),
        *(GoldQuestion(f"syn-category-{i}", "Which of A and B was a composer?", ["A"], "comparison",
                       [[dict(s) for s in jobs]], "synthetic", "c") for i in range(4)),
        *(GoldQuestion(f"bridge-{i}", "Who?", ["C"], "bridge", [jobs[:1]], "synthetic", "c") for i in range(5)),
    ]  # fmt: skip
    check_categories(GoldSet(questions))
    episodes = stub_episodes(questions)
    by_id = {q.id: q for q in questions}
    kept = [ep["id"] for ep in continuation_set(episodes, by_id, {"category": 3}, cap=2)]
    assert "real-category" in kept and sum(i.startswith("syn-category-") for i in kept) == 2, kept
    assert "real-unchecked" in kept and sum(i.startswith("bridge-") for i in kept) == 2, kept
    with pytest.raises(SystemExit):
        main(["--categories-drawn", "5"])
    assert "--categories-drawn 5: expected a count >= 0, drawn from --categories" in capsys.readouterr().err


def test_a_real_yes_no_answer_follows_a_check_of_the_quoted_sentences():
    """Issue 25: real yes/no comparisons quote sentences, not values, and the policy answered them all "yes";
    the check reads each sentence for the asked property or country, and is left out where it would not give
    the gold answer."""
    bands = [{"sub_question": "Muzzle (band)", "finding": "Muzzle is an alternative rock band formed in 1994"},
             {"sub_question": "Screaming Trees", "finding": "Screaming Trees was an American rock band"}]  # fmt: skip
    question = "Are Muzzle and Screaming Trees both alternative rock bands?"
    assert yes_no_verdict(question, bands, "no") == (
        "The question asks whether both are alternative rock bands. Muzzle: yes; Screaming Trees: not stated. Not both."
    )
    assert yes_no_verdict(question, bands, "yes") is None  # the passages do not bear "yes" out
    people = [{"sub_question": "Jerome Storm", "finding": "Jerome Storm was an American film director"},
              {"sub_question": "Andrés Wood", "finding": "Andres Wood is a Chilean film director"}]  # fmt: skip
    assert yes_no_verdict("Are Jerome Storm and Andrés Wood from the same country?", people, "no") == (
        "The question asks whether they are from the same country. Jerome Storm: United States; Andrés Wood: Chile:"
        " different."
    )
    canada = [dict(people[0], finding="Jerome Storm lived in Vancouver, British Columbia, Canada"),
              dict(people[1], finding="Andres Wood is a Canadian film director")]  # fmt: skip
    assert yes_no_verdict("Are Jerome Storm and Andrés Wood from the same country?", canada, "yes").endswith(
        "Jerome Storm: Canada; Andrés Wood: Canada: the same."
    )
    unread = [people[0], dict(people[1], finding="Andres Wood is a film director")]
    assert yes_no_verdict("Are Jerome Storm and Andrés Wood from the same country?", unread, "no") is None
    assert yes_no_verdict("Are Jerome Storm and Andrés Wood in the same state?", people, "no") is None  # no reader
    assert (
        yes_no_verdict(
            "Are Muzzle and Screaming Trees both bands?",
            [bands[1], dict(bands[0], sub_question="Mudhoney")],
            "yes",
        )
        is None
    )  # a name the question does not hold


def blue_moon_chain():
    """A HotpotQA-form bridge: the film, then its director, named in the film's passage."""
    rec = record("bridge", "Which country is the director of Blue Moon from?", ["Blue Moon (film)", "Jo Park"])
    rec["golden_answers"] = ["Korea"]
    passages = {
        "id-Blue Moon (film)": '"Blue Moon (film)"\nBlue Moon is a 1999 film. It was directed by Jo Park in Seoul.',
        "id-Jo Park": '"Jo Park"\nJo Park is a director. He was born in Korea in 1950.',
    }
    return rec, passages


def test_chain_findings_quote_the_sentence_naming_the_next_hop_and_then_the_answer():
    rec, passages = blue_moon_chain()
    plan = plan_from_titles(rec, passages)
    assert [s["finding"] for r in plan for s in r] == [
        "It was directed by Jo Park in Seoul",
        "He was born in Korea in 1950",
    ]
    assert quote('"T"\nOne. Two names Jo Park.', "Nobody") == "One"  # no sentence names it: the first
    assert first_date('"T"\nNo dates here.') is None


def opera_chain(question, golden, second_passage):
    """A HotpotQA-form bridge that searches the opera, then its composer, as the gold plan does."""
    golden = [golden] if isinstance(golden, str) else golden
    rec = record("bridge", question, ["Maria Golovin", "Gian Carlo Menotti"])
    rec["golden_answers"] = golden
    passages = {
        "id-Maria Golovin": '"Maria Golovin"\nMaria Golovin is an opera in three acts by Gian Carlo Menotti.',
        "id-Gian Carlo Menotti": f'"Gian Carlo Menotti"\n{second_passage}',
    }
    plan = plan_from_titles(rec, passages)
    return GoldQuestion("q", question, golden, "bridge", plan, "hotpotqa", "c")


def test_a_chain_that_ends_on_its_answer_checks_the_answer_against_the_question():
    """Issue 25: 19% of HotpotQA's train chains answer with the entity they searched last, and the policy learned
    to answer with an entity it searched, right or not (a third of the validation bridges). Under
    ``--checked-chains`` such a chain's answer turn quotes what the last passage says that the question asks for,
    and says so; one where no such phrase can be read is left out. The shipped gold's turns stay as they were."""
    passage = (
        "Gian Carlo Menotti (July 7, 1911 – February 1, 2007) was born in Italy. "
        "He was an Italian-American composer and librettist."
    )
    q = opera_chain("Which Italian-American composer and librettist wrote the opera Maria Golovin?",
                    "Gian Carlo Menotti", passage)  # fmt: skip
    thin = opera_chain("Which composer wrote the opera Maria Golovin?", "Gian Carlo Menotti", passage)  # one word
    born = opera_chain("In which year was the composer of Maria Golovin born?", "1911", passage)  # ends on a value
    before = {x.question: teacher_turns(x, "parallel", random.Random(0))[-1] for x in (q, thin, born)}
    assert not any("The question asks for" in turn for turn in before.values())

    gold = GoldSet([q, thin, born])
    check_chains(gold)
    assert [x.question for x in gold.questions] == [q.question, born.question]
    assert gold.skipped == Counter(
        {"a chain answered with the entity it searched last, unchecked (--checked-chains)": 1}
    )
    check = (
        'The question asks for "Italian-American composer and librettist", and Gian Carlo Menotti\'s passage says it.'
    )
    last = teacher_turns(q, "parallel", random.Random(0))[-1]
    # the quote adds the sentence that holds what the question asks for to the first one, then the check
    assert "He was an Italian-American composer and librettist" in last
    assert f"{check} So the answer is Gian Carlo Menotti." in last and last.endswith(
        "<answer> Gian Carlo Menotti </answer>"
    )
    assert teacher_turns(born, "parallel", random.Random(0))[-1] == before[born.question]
    # the entity searched last is the second golden answer (MuSiQue's "Jessie Woodrow Wilson Sayre"): it was missed
    second = opera_chain(q.question, ["Menotti", "Gian Carlo Menotti"], passage)
    gold = GoldSet([second])
    check_chains(gold)
    assert gold.questions == [second] and gold.questions[0].plan[-1][0]["check"] == check


def test_the_asked_phrase_is_the_longest_shared_run_of_the_questions_words_without_the_searched_names():
    text = "Groundhog Day is a 1993 American fantasy-comedy film directed by Harold Ramis, starring Bill Murray"
    assert (
        asked_phrase("What 1993 American fantasy-comedy film stars Bill Murray?", text)
        == "1993 American fantasy-comedy film"
    )
    assert asked_phrase("What film was directed by Harold Ramis?", text) == "directed by Harold Ramis"
    # the searched entity's name is not a check of it, nor a stopword-edged run of one word
    assert asked_phrase("What film was directed by Harold Ramis?", text, {"harol", "ramis"}) is None
    assert (
        asked_phrase(
            "Which novel by Margaret Atwood?", "a novel by Canadian author Margaret Atwood", {"marga", "atwoo"}
        )
        is None
    )


def test_gold_questions_whose_passages_are_missing_or_whose_hops_look_reversed_are_counted(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    rows = [
        {"id": f"q{i}", "question": "Who directed Blue Moon?", "golden_answers": ["Jo Park"], "type": "bridge",
         "supporting_titles": ["Blue Moon", "Jo Park"], "supporting_doc_ids": ["p1", ids]}
        for i, ids in zip([1, 2, 3], ["p2", "p3", "missing"], strict=True)  # ids of the train part
    ]  # fmt: skip
    rows[1]["golden_answers"] = ["Seoul"]  # written in the first hop's passage only
    corpus = [
        {"id": "p1", "contents": '"Blue Moon"\nBlue Moon was directed by Jo Park in Seoul.'},
        {"id": "p2", "contents": '"Jo Park"\nJo Park is a director.'},
        {"id": "p3", "contents": '"Jo Park"\nJo Park is a film director.'},
    ]
    assert {split_part(r["id"]) for r in rows} == {"train"}
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    gold = shared_questions("set", root=tmp_path)
    assert gold.skipped == {
        "set: the answer is not in the last hop's passages (hop order doubtful)": 1,
        "set: a gold passage is missing from its corpus": 1,
    }
    assert [q.id for q in gold.questions] == ["q1"]


def test_a_corpus_with_a_decoy_under_a_gold_id_is_refused_naming_both_lines(tmp_path):
    """Issue 27: a decoy line with a gold passage's id was read in its place, and every episode was kept."""
    folder = tmp_path / "set"
    folder.mkdir()
    row = {"id": "q1", "question": "Who directed Blue Moon?", "golden_answers": ["Jo Park"], "type": "bridge",
           "supporting_titles": ["Blue Moon", "Jo Park"], "supporting_doc_ids": ["p1", "p2"]}  # fmt: skip
    corpus = [
        {"id": "p1", "contents": '"Blue Moon"\nBlue Moon was directed by Jo Park.'},
        {"id": "p2", "contents": '"Jo Park"\nJo Park is a director.'},
        {"id": "p1", "contents": '"Blue Moon"\nBlue Moon is a film.'},  # the decoy: same id, without the fact
    ]
    (folder / "dev.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    with pytest.raises(ValueError, match=r"corpus\.jsonl:3: id 'p1' is already on line 1: expected one passage per id"):
        shared_questions("set", root=tmp_path)
    (folder / "corpus.jsonl").write_text(json.dumps(corpus[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2: not a corpus line"):
        shared_questions("set", root=tmp_path)


def test_a_training_mix_whose_synthetic_world_is_gone_gets_it_back_and_any_other_missing_corpus_is_refused(tmp_path):
    """Issue 26: a GRPO resume on a fresh checkout failed mid-step; the mix names a world that is not committed."""
    _, questions = generate(104, WORLD_ENTITIES, tmp_path / "made", per_family=WORLD_PER_FAMILY)
    asked = [json.loads(line) for line in questions.read_text().splitlines()][:3]
    corpus = tmp_path / "gone" / "synth-104" / "corpus.jsonl"
    rows = [{"id": q["id"], "question": q["question"], "corpus": str(corpus)} for q in asked]
    restore_corpora(rows)
    assert corpus.read_bytes() == (tmp_path / "made" / "corpus.jsonl").read_bytes()

    corpus.unlink()
    stranger = {"id": "s1", "question": "Which city is larger, Paris or Berlin?", "corpus": str(corpus)}
    with pytest.raises(ValueError, match=r"seed 104 .* 1 of the rows naming it are not its questions \(first: 's1'\)"):
        restore_corpora([*rows, stranger])

    elsewhere = {"id": "h1", "question": "Who directed Blue Moon?", "corpus": str(tmp_path / "hotpotqa.jsonl")}
    with pytest.raises(FileNotFoundError, match=r"\(first: 'h1'\) name the corpus .*hotpotqa\.jsonl, which is missing"):
        restore_corpora([elsewhere])


def test_the_train_and_validation_parts_are_stable_and_disjoint():
    ids = [f"q{i}" for i in range(1000)]
    parts = [split_part(i) for i in ids]
    assert parts == [split_part(i) for i in ids]
    assert 0.25 < parts.count("validation") / len(ids) < 0.35


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    corpus, questions = generate(seed=11, entities=120, out=tmp_path_factory.mktemp("synth"), per_family=1)
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    return [
        GoldQuestion(q["id"], q["question"], q["golden_answers"], q["type"], q["plan"], "synthetic", str(corpus))
        for q in rows
    ]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_teacher_turns_are_well_formed_and_follow_the_plan(world, mode):
    for q in world:
        turns = teacher_turns(q, mode, random.Random(0))
        assert all(is_well_formed_turn(t) for t in turns), turns
        actions = [parse_action(t, mode) for t in turns]
        searched = [list(a.sub_queries) for a in actions[:-1]]
        expected = subs(q.plan) if mode == "parallel" else [[s] for r in subs(q.plan) for s in r]
        assert searched == expected
        assert actions[-1].kind == "answer" and actions[-1].content == q.golden_answers[0]


def test_think_text_says_why_sub_questions_are_independent_or_dependent(world):
    by_family = {q.question_class: q for q in world}
    first = teacher_turns(by_family["parallelisable"], "parallel", random.Random(1))[0]
    assert any(w in first for w in ("independent", "on its own", "depends on another"))
    chain = teacher_turns(by_family["sequential"], "parallel", random.Random(1))[0]
    assert any(w in chain for w in ("depend", "one step at a time", "chain"))


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_a_gold_episode_is_the_rollout_context_and_masks_the_environment(world, tokenizer, mode):
    q = next(q for q in world if q.type == "comparison" and len(q.plan[0]) == 2)
    teacher = TeacherPolicy(tokenizer, {q.question: teacher_turns(q, mode, random.Random(0))})
    agent = ParallelSearchAgent(llm=teacher, retriever=q.corpus, mode=mode, topk=2)
    out = asyncio.run(agent.ainvoke({"question": q.question}))
    ep = episode(q, out, mode, tokenizer)
    trajectory = out["trajectory"]
    # the sequence trained on is what the policy is conditioned on in a rollout, then the end-of-turn token
    rollout_context = context_ids(tokenizer, trajectory["prompt_messages"], trajectory["transcript"])
    assert ep["prompt_ids"] + ep["completion_ids"] == [*rollout_context, tokenizer.eos_token_id]
    example = sft_example(ep)
    labelled = [t for t in example["labels"] if t != -100]
    model_text = "".join(s["text"] for s in trajectory["transcript"] if s["role"] == "model")
    assert tokenizer.decode(labelled) == model_text
    masked = [t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label == -100]
    assert masked[: len(ep["prompt_ids"])] == ep["prompt_ids"]
    env_text = tokenizer.decode(masked[len(ep["prompt_ids"]) :])
    assert env_text.count("<information>") == len(trajectory["search_rounds"]) == (1 if mode == "parallel" else 2)


def test_left_out_episodes_are_counted_by_reason(world, tokenizer):
    deep = next(q for q in world if q.type == "bridge" and len(q.plan) == 4)
    wrong = next(q for q in world if q.type is None)
    wrong = GoldQuestion(
        "w", wrong.question, wrong.golden_answers, None,
        [[dict(wrong.plan[0][0], passage_id="not-in-corpus")]], "synthetic", wrong.corpus,
    )  # fmt: skip
    short = next(q for q in world if q.type == "comparison")
    episodes, skipped = build_episodes([deep, wrong, short], "parallel", tokenizer, max_length=64, topk=2)
    assert episodes == []
    assert skipped == {
        "needs 4 searches, more than max_turns=4 allows": 1,
        "a gold passage was not retrieved": 1,
        "longer than max_length=64 tokens": 1,
    }
    # a comparison of many entities whose last turn is more than the policy may write in one turn
    wide = max((q for q in world if q.type == "comparison"), key=lambda q: len(q.plan[0]))
    episodes, skipped = build_episodes([wide], "parallel", tokenizer, max_new_tokens=40)
    assert episodes == [] and skipped == {"a turn longer than max_new_tokens=40 (the policy would be cut off)": 1}


def test_a_rank_stated_without_a_value_is_read_from_the_other_passage_or_decides_by_itself():
    """v5 quoted "Mount Everest is the highest mountain on Earth" and K2's "8,611 metres ... after Mount Everest at
    8,849 metres", then answered K2. The verdict reads each value where a passage states it, the other entity's
    included, and without one lets the rank decide over another entity of the same place."""
    top = {"entity": "Mount Aro", "sub_question": "Mount Aro", "finding": "Mount Aro is the highest mountain in Velia",
           "superlative": "the highest mountain in Velia", "place": "Velia", "value_there": "8,849 metres"}  # fmt: skip
    second = {"entity": "Mount Bel", "sub_question": "Mount Bel", "value": "8,611 metres",
              "finding": "Mount Bel, at 8,611 metres, is the second-highest mountain in Velia, after Mount Aro at "
              "8,849 metres"}  # fmt: skip
    assert ranked_verdict([top, second], "Mount Aro") == (
        "The values read: Mount Aro: 8,849 metres, as Mount Bel's passage states; Mount Bel: 8,611 metres. The "
        "question asks for the largest. 8849 vs 8611: after 8, 8 > 6, so 8849 is larger. The largest is 8,849 metres "
        "(Mount Aro)."
    )
    assert ranked_verdict([second, top], "Mount Bel").endswith(
        "8611 vs 8849: after 8, 6 < 8, so 8611 is smaller. The smallest is 8,611 metres (Mount Bel)."
    )
    unstated = {k: v for k, v in top.items() if k != "value_there"}
    third = {
        "entity": "Mount Cor",
        "sub_question": "Mount Cor height",
        "finding": "5,120 metres",
        "value": "5,120 metres",
    }
    assert ranked_verdict([third, unstated], "Mount Cor") == (
        "The values read: Mount Cor: 5,120 metres; Mount Aro: no value stated, but it is the highest mountain in "
        "Velia. The question asks for the smallest. Mount Aro is the highest mountain in Velia, and Mount Cor is in "
        "Velia too, so Mount Aro is the larger. The smallest is Mount Cor."
    )
    assert ranked_verdict([dict(second, entity="Mount Dun"), second], "Mount Bel") is None  # a tie decides nothing
    plain = [{k: v for k, v in s.items() if k != "entity"} for s in (second, third)]  # not a ranked pair
    assert ranked_verdict(plain, "Mount Bel") is None
    q = GoldQuestion("r", "Which mountain is higher, Mount Aro or Mount Bel?", ["Mount Aro"], "comparison",
                     [[top, second]], "synthetic", "c")  # fmt: skip
    assert (
        "Mount Aro: 8,849 metres, as Mount Bel's passage states" in teacher_turns(q, "parallel", random.Random(0))[-1]
    )


@pytest.mark.parametrize(
    ("question", "answer", "verdict"),
    [
        ("Which university is older: A or B?", "B", "The question asks for the earliest. 1868 vs 1831"),
        ("Which university is older: A or B?", "A", None),  # the year read is not what makes A older
        ("Who lived longer, A or B?", "A", None),  # birth years: no direction a lifespan is read in
        ("Which band has released the most studio albums, A or B?", "A", None),  # "released": dates read
        ("Which was founded later, A or B?", "A", "The question asks for the latest. 1868 vs 1831"),
    ],
)
def test_a_comparison_is_checked_only_in_the_direction_the_question_asks(question, answer, verdict):
    """The check took its direction from the gold answer's value: where the date read was not what the question
    compares, the teacher wrote "asks for the latest" for "Which university is older?" (8 of 78 real checks)."""
    steps = [{"sub_question": "A", "finding": "1868"}, {"sub_question": "B", "finding": "1831"}]
    found = comparison_verdict(question, steps, answer)
    assert (found or "").startswith(verdict or "") and (found is None) == (verdict is None)


def test_a_birth_date_glued_to_the_death_date_is_read_as_the_birth_date():
    """2Wiki prints "( 25 October 188910 November 1981)": the year ran into the next date, so "born first" read
    the death date."""
    gance = '"Abel Gance"\nAbel Gance( 25 October 188910 November 1981) was a French film director.'
    assert asked_date(gance, "Which film has the director born first, A or B?") == "25 October 1889"
    assert asked_date(gance, "Which film has the director who died first, A or B?") == "10 November 1981"


def test_a_clipped_quote_keeps_the_whole_name_it_was_chosen_for():
    """Its window was placed at the name's first word, found inside another word ("King" in "Kingdom")."""
    filler = " ".join(f"w{i}" for i in range(30))
    contents = f'"X"\nHe starred in Kingdom of Heaven, {filler} and played King Duncan in Macbeth.'
    assert "King Duncan" in quote(contents, "King Duncan")


def test_a_quote_does_not_end_at_a_names_initial_or_an_abbreviation():
    """The sentence splitter ended a sentence at every period: 34 of the real train questions' findings stopped
    inside a name ("directed by Charles H", "after Michael P"), and the next search named what was not read."""
    fay = '"Oliver Fricker"\nOliver Fricker is the second high-profile foreigner (after Michael P. Fay) to be caned.'
    assert quote(fay, "Michael P. Fay").endswith("(after Michael P. Fay) to be caned")
    film = '"Inside Job"\nInside Job is a 2010 film directed by Charles H. Ferguson. It won an Academy Award.'
    assert quote(film) == "Inside Job is a 2010 film directed by Charles H. Ferguson"
    army = '"X"\nHe served in the U.S. Army. Later he taught at Dr. Smith\'s school. He died in St. Louis.'
    assert quote(army, "St. Louis") == "He died in St. Louis"
    assert quote(army) == "He served in the U.S. Army"
    two = '"Y"\nThe genus was divided into sections A, B, and C. It is found in Peru.'
    assert quote(two, "Peru").endswith("It is found in Peru")  # a sentence ending on a letter joins the next one
    long = (
        '"Cersei Lannister"\nCersei Lannister is a fictional character in the "A Song of Ice and Fire" series of '
        "fantasy novels by American author George R. R. Martin, and its television adaptation Game of Thrones."
    )
    assert not quote(long).endswith(".")  # clipped after "R.": the think turn adds its own period


def test_a_chain_whose_next_hop_was_never_read_is_left_out():
    """44 real chains searched an entity named neither in the question nor in the passage read before it
    ("So Martin (TV series): … Now I search for Garrett Morris."): they taught the policy to make bridges up."""
    rec = record(
        "bridge", "Which actor of Martin was on Saturday Night Live?", ["Martin (TV series)", "Garrett Morris"]
    )
    rec["golden_answers"] = ["Garrett Morris"]
    passages = {
        "id-Martin (TV series)": '"Martin (TV series)"\nMartin is an American sitcom that aired on Fox.',
        "id-Garrett Morris": '"Garrett Morris"\nGarrett Morris was an original cast member of Saturday Night Live.',
    }
    assert plan_from_titles(rec, passages) == (
        "a round's entity is named neither in the question nor in what was read before it"
    )
    passages["id-Martin (TV series)"] += " It starred Martin Lawrence and Garrett Morris."
    assert isinstance(plan_from_titles(rec, passages), list)


def test_a_comparison_reads_dates_only_when_it_asks_which_came_first_or_last():
    """ "Which band has released the most studio albums?" says "released": each passage's first date was quoted."""
    rec = record("comparison", "Which band has released the most studio albums, Ash or Blur?", ["Ash", "Blur"])
    rec["golden_answers"] = ["Blur"]
    passages = {"id-Ash": '"Ash"\nAsh is a band formed in 1992.', "id-Blur": '"Blur"\nBlur is a band formed in 1988.'}
    assert [s["value_read"] for s in plan_from_titles(rec, passages)[0]] == [False, False]


def test_a_comparison_whose_values_decide_against_its_answer_is_left_out():
    """ "Which is older, UC Berkeley or Syracuse?" read 1868 and 1831 and answered Berkeley, unchecked."""
    rec = record("comparison", "Which is older, Berkeley or Syracuse?", ["Berkeley", "Syracuse"])
    rec["golden_answers"] = ["Berkeley"]
    passages = {
        "id-Berkeley": '"Berkeley"\nThe University of California, Berkeley was founded in 1868.',
        "id-Syracuse": '"Syracuse"\nSyracuse University traces its roots to a seminary of 1831.',
    }
    plan = plan_from_titles(rec, passages)
    gold = GoldSet(questions=[GoldQuestion("c", rec["question"], ["Berkeley"], "comparison", plan, "hotpotqa", "c")])
    drop_undecided_comparisons(gold)
    assert gold.questions == [] and gold.skipped == {"a comparison whose values read do not decide for its answer": 1}


def test_a_chain_searched_one_step_at_a_time_opens_as_a_chain_not_as_one_search():
    """Every sequential-mode chain of the Search-R1 baseline's gold opened "One search for X should answer this"."""
    rec, passages = blue_moon_chain()
    q = GoldQuestion("b", rec["question"], ["Korea"], "bridge", plan_from_titles(rec, passages), "hotpotqa", "c")
    for seed in range(6):
        first = teacher_turns(q, "sequential", random.Random(seed))[0]
        assert "one search is enough" not in first and "should answer this" not in first, first


def test_an_answer_title_cased_by_its_dataset_is_taught_as_its_passage_writes_it(tmp_path):
    """31 2Wiki episodes answered "Boyd Merriman, 1St Baron Merriman" where the passage read says "1st"."""
    folder = tmp_path / "set"
    folder.mkdir()
    row = {"id": "q1", "question": "Who is the father of Jo Merriman?", "golden_answers": ["Boyd Merriman, 1St Baron"],
           "type": "bridge", "supporting_titles": ["Jo Merriman", "Boyd Merriman, 1st Baron"],
           "supporting_doc_ids": ["p1", "p2"]}  # fmt: skip
    corpus = [
        {"id": "p1", "contents": '"Jo Merriman"\nJo Merriman is the son of Boyd Merriman, 1st Baron.'},
        {"id": "p2", "contents": '"Boyd Merriman, 1st Baron"\nBoyd Merriman, 1st Baron was a judge.'},
    ]
    (folder / "dev.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (q,) = shared_questions("set", root=tmp_path).questions
    assert q.golden_answers == ["Boyd Merriman, 1st Baron", "Boyd Merriman, 1St Baron"]
    assert teacher_turns(q, "parallel", random.Random(0))[-1].endswith("<answer> Boyd Merriman, 1st Baron </answer>")


def test_a_clipped_quote_is_cut_between_names_and_dates_and_ends_on_a_content_word():
    """116 real episodes quoted a sentence cut inside a name or a date by the 24-word window, and the finding
    joined the next with "and": "lying on the Gulf of and Jingjiang"."""
    filler = " ".join(f"w{i}" for i in range(18))
    gulf = f'"Qinzhou"\nQinzhou is a city {filler} lying on the Gulf of Tonkin with 3 million people.'
    assert quote(gulf).endswith(f"{filler} lying")  # not "lying on the Gulf of"
    shorter = " ".join(filler.split()[:16])
    date = f'"Edo"\nEdo was a {shorter} conductor born on 1 June 1941 in Amsterdam.'
    assert quote(date).endswith(f"{shorter} conductor born")  # not "born on 1 June"
    more = " ".join(f"w{i}" for i in range(26))
    kept = f'"Jo"\nJo {more} was the son of Boyd Merriman, 1st Baron Merriman, a judge.'
    assert "son of Boyd Merriman, 1st Baron Merriman" in quote(kept, "Boyd Merriman, 1st Baron Merriman")


def test_a_cap_by_source_and_class_reports_what_it_kept_and_what_it_left_out():
    """Issue 25: a gold capped with ``--per-source-class N`` says, per source and class, what it kept and how many
    it left out and why, so a retrain's make-up can be read from its summary."""
    born = [{"sub_question": "A", "finding": "A (born 1901)"}, {"sub_question": "B", "finding": "B (born 1899)"}]
    questions = [
        *(GoldQuestion(f"syn-{i}", "Which is older?", ["B"], "comparison", [born], "synthetic", "c") for i in range(5)),
        *(GoldQuestion(f"pair-{i}", "Which is older?", ["B"], "comparison", [born], "hotpotqa-pairs", "c")
          for i in range(2)),
        *(GoldQuestion(f"bridge-{i}", "Who?", ["C"], "bridge", [born[:1]], "synthetic", "c") for i in range(4)),
    ]  # fmt: skip
    episodes = stub_episodes(questions)
    kept = capped(episodes, 3)
    skipped = left_out(episodes, kept, "beyond --per-source-class 3")
    assert skipped == Counter({"synthetic, parallelisable: beyond --per-source-class 3": 2,
                               "synthetic, sequential: beyond --per-source-class 3": 1})  # fmt: skip
    report = summary(GoldSet(questions), kept, skipped, len(episodes))
    assert report["by_source_class"] == {
        "synthetic, parallelisable": 3, "hotpotqa-pairs, parallelisable": 2, "synthetic, sequential": 3,
    }  # fmt: skip
    assert report["skipped_episodes"]["synthetic, parallelisable: beyond --per-source-class 3"] == 2
