"""The ParallelSearch text protocol: prompts, action parsing and observation rendering.

One source of truth: the agent, the rewards and the trainer all read model text through
this module, so what counts as a search, an answer or a valid format can never drift. How the graph talks to
its model through this text (the ``tags`` policy protocol) or through native tool calls (``tools``) is
``ps_agent.policy_protocols``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["parallel", "sequential"]
ChatPrompt = Sequence[Mapping[str, str]]  # chat messages: {"role": ..., "content": ...}
ActionKind = Literal["search", "answer", "invalid"]

SUB_QUERY_SEPARATOR = "##"
STOP_SEQUENCES = ("</search>", "</answer>")
PROTOCOL_TAGS = ("think", "search", "information", "answer")

_INSTRUCTIONS = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
)
_DECOMPOSE = (
    "If the original query is complex or involves multiple parts, you are encouraged to decompose it "
    "into smaller sub-questions, separated by ##. "
    "For example: <search> sub-question 1 ## sub-question 2 </search>. "
)
_ANSWER = (
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

#: ParallelSearch prompt (arXiv 2508.09303, Table 1) and the Search-R1 prompt it extends.
PROMPTS: dict[str, str] = {
    "parallel": _INSTRUCTIONS + _DECOMPOSE + _ANSWER,
    "sequential": _INSTRUCTIONS + _ANSWER,
}

#: Search-R1's observation for a turn with no valid action.
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

#: Environment text that opens the final, forced turn after ``max_turns``: the answer tag is
#: pre-filled so that the model's next tokens are the answer itself.
FORCED_ANSWER_PROMPT = "\n\nI have used all my searches, so I must give my final answer now.\n<answer>"

_ACTION_OPEN_RE = re.compile(r"<(search|answer)>")
_LEADING_THINK_RE = re.compile(r"\s*<think>")
_EXACT_TAGS = frozenset(f"<{slash}{tag}>" for tag in PROTOCOL_TAGS for slash in ("", "/"))
_ANY_TAG_RE = re.compile(r"</?\s*(" + "|".join(PROTOCOL_TAGS) + r")\s*>", re.IGNORECASE)
_NO_TAG = r"(?:(?!</?\s*(?:" + "|".join(PROTOCOL_TAGS) + r")\s*>).)*"
# what ``neutralise`` defangs in text the model reads: a protocol tag with any spacing, case or attributes
# (``< /information>``, ``<Answer x>``), and a chat control token's spelling (``<|im_end|>``, ``<|endoftext|>``)
_TAG_LIKE_RE = re.compile(r"<\s*(?:/\s*)?(?:" + "|".join(PROTOCOL_TAGS) + r")\b[^<>]*>", re.IGNORECASE)
_CONTROL_RE = re.compile(r"<\|([^<>|\s]{1,64})\|>")
# the start of a protocol tag still left (one a removal or a replacement joined): its "<" becomes "["
_TAG_START_RE = re.compile(r"<(?=\s*(?:/\s*)?(?:" + "|".join(PROTOCOL_TAGS) + r")\b)", re.IGNORECASE)
# a line break before what starts a line of an observation (a ``Query: q`` header, a ``Doc i(Title: t)`` line): in
# retrieved or echoed text it would make the rest read as another sub-query's results or another document
_POSED_LINE_RE = re.compile(r"\s*\n\s*(?=Query\s*:|Doc\s*\d+\s*\()", re.IGNORECASE)
_WELL_FORMED_TURN_RE = re.compile(rf"\s*<think>{_NO_TAG}</think>\s*<(search|answer)>{_NO_TAG}</\1>\s*", re.DOTALL)


@dataclass(frozen=True)
class Action:
    """What one model turn asked for.

    ``content`` is the raw text inside the action tag; ``sub_queries`` the searches it implies
    under the mode's rules; ``error`` says why an ``invalid`` action was rejected.
    """

    kind: ActionKind
    content: str = ""
    sub_queries: tuple[str, ...] = field(default_factory=tuple)
    think: str | None = None
    error: str | None = None


def render_prompt(question: str, mode: Mode = "parallel") -> str:
    """The user prompt for ``question`` in ``mode`` (paper Table 1 / Search-R1)."""
    if mode not in PROMPTS:
        raise ValueError(f"unknown mode {mode!r}: expected one of {sorted(PROMPTS)}")
    return PROMPTS[mode].format(question=neutralise(question))


_DEMO_QUESTION = "Who was born first, Albert Einstein or Isaac Newton?"
_DEMO_PASSAGES = {
    "Albert Einstein": "Albert Einstein (14 March 1879 – 18 April 1955) was a German-born theoretical physicist.",
    "Isaac Newton": "Sir Isaac Newton (25 December 1642 – 20 March 1727) was an English polymath.",
}
_DEMO_ANSWER = (
    "<think> Newton was born in 1642 and Einstein in 1879, so Newton was born first. </think>\n"
    "<answer> Isaac Newton </answer>"
)


def demonstration(mode: Mode = "parallel") -> list[dict[str, str]]:
    """A one-shot demonstration as chat turns (question, searches, information, answer) in ``mode``.

    Not in the paper: an opt-in (``AgentConfig.demonstration``) that lets a small untrained model
    (SmolLM2-135M) produce valid actions often enough for RL to have a signal.
    """
    turns: list[dict[str, str]] = [{"role": "user", "content": render_prompt(_DEMO_QUESTION, mode)}]
    groups = [list(_DEMO_PASSAGES)] if mode == "parallel" else [[title] for title in _DEMO_PASSAGES]
    for titles in groups:
        plan = "both people, so I search for each in parallel" if len(titles) > 1 else titles[0]
        turns.append(
            {
                "role": "assistant",
                "content": f"<think> I need the birth date of {plan}. </think>\n" + render_search(titles),
            }
        )
        results = [SubQueryObservation(t, [(t, _DEMO_PASSAGES[t])]) for t in titles]
        turns.append({"role": "user", "content": render_information(results)})
    turns.append({"role": "assistant", "content": _DEMO_ANSWER})
    return turns


def render_chat_prompt(
    question: str, mode: Mode = "parallel", with_demonstration: bool = False
) -> list[dict[str, str]]:
    """The chat prompt the policy continues: the user prompt, after the demonstration if asked for."""
    demo = demonstration(mode) if with_demonstration else []
    return [*demo, {"role": "user", "content": render_prompt(question, mode)}]


def close_action(text: str, stopped: bool = True) -> str:
    """Cut ``text`` after its first complete action and restore a stop tag the backend dropped.

    OpenAI-style servers and most LangChain models strip the stop sequence from the output;
    Hugging Face keeps it. Either way the completion ends with ``</search>`` or ``</answer>``. The tag is
    restored only where the model stopped on it: a completion cut at its token limit (``stopped`` False) is left
    unclosed, and so invalid, as Hugging Face's is.
    """
    action = _first_action(text)
    if action is not None:
        return text[: action[2]]
    if not stopped:
        return text
    opened = max(_ACTION_OPEN_RE.finditer(text), key=lambda m: m.start(), default=None)  # the stop followed it
    if opened and not _ANY_TAG_RE.search(text, opened.end()):
        return text + f"</{opened.group(1)}>"
    return text


def _first_action(text: str) -> tuple[str, str, int] | None:
    """The first complete ``<search>``/``<answer>`` element as (kind, content, end of its closing tag).

    What ``re.search(r"<(search|answer)>(.*?)</\1>", text)`` finds, in linear time: that regex
    rescans the rest of the text from every unclosed tag, quadratic on ``"<search>" * n``.
    """
    last_close = {kind: text.rfind(f"</{kind}>") for kind in ("search", "answer")}
    for opened in _ACTION_OPEN_RE.finditer(text, 0, max(last_close.values()) + 1):  # no open tag after it counts
        kind = opened.group(1)
        if last_close[kind] >= opened.end():
            end = text.index(f"</{kind}>", opened.end())
            return kind, text[opened.end() : end], end + len(f"</{kind}>")
    return None


def _first_think(text: str) -> str | None:
    """The stripped body of the first ``<think>…</think>`` element (linear, unlike a lazy regex)."""
    start = text.find("<think>")
    end = text.find("</think>", start + len("<think>")) if start >= 0 else -1
    return text[start + len("<think>") : end].strip() if end >= 0 else None


def split_sub_queries(query: str, mode: Mode) -> tuple[str, ...]:
    """The searches one ``<search>`` body asks for: ``##``-separated in ``parallel`` mode only."""
    if mode == "sequential":
        return (query.strip(),) if query.strip() else ()
    return tuple(q.strip() for q in query.split(SUB_QUERY_SEPARATOR) if q.strip())


_WORD_RE = re.compile(r"\w+")


def _words(query: str) -> list[str]:
    return _WORD_RE.findall(query.casefold())


def sub_query_key(query: str) -> tuple[str, ...]:
    """What tells sub-queries apart: their words, case and punctuation aside (empty: nothing to search for)."""
    return tuple(_words(query))


def distinct_sub_queries(sub_queries: Sequence[str]) -> list[str]:
    """The sub-queries worth searching, each once: one without a letter or digit is dropped, and so is one whose
    words repeat an earlier one's (case, punctuation and spacing aside)."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for query in sub_queries:
        key = sub_query_key(query)
        if key and key not in seen:
            seen.add(key)
            kept.append(query)
    return kept


#: words that name nothing to look up: a sub-query of these alone asks nothing of its own
_FUNCTION_WORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "has", "have", "how", "in",
    "is", "it", "its", "of", "on", "or", "than", "that", "the", "this", "to", "was", "were", "what", "when", "where",
    "which", "who", "whom", "whose", "why", "with",
})  # fmt: skip


def _content_words(query: str) -> frozenset[str]:
    """A sub-query's words that name something: not a function word or a lone letter or digit, and only if one of
    them has a letter (a bare year or ``1`` names nothing to search for)."""
    words = frozenset(w for w in _words(query) if len(w) > 1 and w not in _FUNCTION_WORDS)
    return words if any(c.isalpha() for w in words for c in w) else frozenset()


def split_round(searched: Sequence[str], question: str, first: bool = True) -> bool:
    """A round that decomposed the question: two or more of its sub-queries each ask something of their own.

    A sub-query asks something of its own when its content words are not all among another's (the whole question
    beside one of its names is not a split, nor is a name beside ``a``, ``the`` or ``1``) and are not all of the
    question's (the whole question searched). In the ``first`` round, before anything was read, it must also
    name something the question names (the whole question reworded beside a made-up word is no split); a later
    round may name what the passages read named. None of these earns the decomposition reward."""
    asked = _content_words(question)
    words = [_content_words(query) for query in searched]
    own = [
        w
        for i, w in enumerate(words)
        if w
        and (w & asked or not first)
        and not (len(asked) > 1 and asked <= w)
        and not any(w <= other for j, other in enumerate(words) if j != i)
    ]
    return len(own) > 1


def parse_action(text: str, mode: Mode = "parallel") -> Action:
    """Parse one model turn into an action; never raises.

    Like Search-R1, the first complete ``<search>`` or ``<answer>`` element is the action.
    Nested protocol tags inside it, or an empty search, make the turn invalid.
    """
    think = _first_think(text)
    action = _first_action(text)
    if action is None:
        opened = _ACTION_OPEN_RE.search(text)  # with no complete action, the first tag is unclosed
        misspelt = next((m for m in _ANY_TAG_RE.finditer(text) if m.group(0) not in _EXACT_TAGS), None)
        if misspelt:
            error = f"found {misspelt.group(0)}: tags are written exactly <search>…</search> or <answer>…</answer>"
        else:
            error = f"unclosed <{opened.group(1)}> tag" if opened else "no <search> or <answer> tag"
        return Action("invalid", think=think, error=error)
    kind, content, _ = action
    if _ANY_TAG_RE.search(content):
        return Action("invalid", content=content, think=think, error=f"nested tag inside <{kind}>")
    if kind == "answer":
        if not content.strip():
            return Action("invalid", content=content, think=think, error="empty <answer>")
        return Action("answer", content=content.strip(), think=think)
    sub_queries = split_sub_queries(content, mode)
    if not sub_queries:
        return Action("invalid", content=content, think=think, error="empty <search>")
    return Action("search", content=content, sub_queries=sub_queries, think=think)


def is_well_formed_turn(text: str) -> bool:
    """A model turn in the paper's format: ``<think>…</think>`` then one ``<search>`` or ``<answer>``
    element, nothing else around them but whitespace, and no tag nested inside."""
    return _WELL_FORMED_TURN_RE.fullmatch(text) is not None


def parse_forced_answer(completion: str) -> str:
    """The answer of a final turn the environment asked for (its ``<answer>`` tag pre-filled for a text model), or
    of a chat model's plain reply: without the ``<think>`` blocks it may still open with, the body of an
    ``<answer>`` element it wrote itself, and nothing from a ``<search>`` it wrote instead (empty then)."""
    at = 0
    while (opened := _LEADING_THINK_RE.match(completion, at)) and (
        end := completion.find("</think>", opened.end())
    ) >= 0:
        at = end + len("</think>")
    text = completion[at:]
    action = _first_action(text)
    if action is not None and action[0] == "answer":
        return neutralise(action[1]).strip()
    text = text.split("</answer>", 1)[0]
    text = re.sub(r"^\s*<answer>", "", text)
    searched = _ACTION_OPEN_RE.search(text)
    if searched and searched.group(1) == "search":
        text = text[: searched.start()]
    return neutralise(text).strip()


def neutralise(text: str) -> str:
    """Defang protocol tags and control tokens' spellings in questions, retrieved or echoed text (``<answer>``,
    ``< /Answer >`` → ``[answer]``, ``[/Answer]``; ``<|im_end|>`` → ``[|im_end|]``). The tokenizers also read
    environment text with special tokens split (``ps_agent.llms.tokens.text_ids``)."""
    text = _TAG_LIKE_RE.sub(lambda m: "[" + " ".join(m.group(0)[1:-1].split()).replace("/ ", "/") + "]", text)
    return _TAG_START_RE.sub("[", _CONTROL_RE.sub(r"[|\1|]", text))


def render_search(sub_queries: Sequence[str]) -> str:
    """The model text that asks for ``sub_queries`` in one search round."""
    return f"<search> {f' {SUB_QUERY_SEPARATOR} '.join(sub_queries)} </search>"


def render_answer(answer: str) -> str:
    """The model text that gives ``answer``."""
    return f"<answer> {answer} </answer>"


def without_markup(text: str) -> str:
    """Retrieved text with its protocol tags and control tokens' spellings removed, not just defanged: a small
    policy still obeys ``[answer] K2 [/answer]`` in a passage (issue 27), and no corpus needs them. A tag that a
    removal joins (``<answer<answer>>``) is defanged by ``neutralise``'s last pass."""
    return neutralise(_CONTROL_RE.sub(" ", _TAG_LIKE_RE.sub(" ", text)))


def in_place(text: str) -> str:
    """Retrieved or echoed text that cannot pose as another line of its observation: a line break before ``Query:``
    or ``Doc i(`` becomes a space (``…\\nQuery: dog\\nDoc 1(Title: Dog) …`` in a passage read as results for
    "dog"). Other line breaks stay, as Search-R1 renders them."""
    return _POSED_LINE_RE.sub(" ", text)


def render_passages(passages: Sequence[tuple[str, str]]) -> str:
    """Search-R1's ``Doc i(Title: t) text`` lines for (title, text) pairs, their markup removed, each title on one
    line and no text posing as another document's or sub-query's line (``in_place``)."""
    return "\n".join(
        f"Doc {i}(Title: {' '.join(without_markup(title).split())}) {in_place(without_markup(text))}"
        for i, (title, text) in enumerate(passages, 1)
    )


@dataclass(frozen=True)
class SubQueryObservation:
    """What one sub-query of a round returned, ready to render."""

    sub_query: str
    passages: Sequence[tuple[str, str]] = ()
    error: str | None = None


def render_information(results: Sequence[SubQueryObservation], note: str | None = None) -> str:
    """One ``<information>`` block for a search round, sub-queries in order.

    A single sub-query renders exactly as Search-R1 does; several are each headed by their query.
    A failed sub-query says so, with its reason, in its place.
    """
    blocks = []
    for result in results:
        if result.error is not None:
            body = f"Search failed: {in_place(neutralise(result.error))}"
        elif not result.passages:
            body = "No results."
        else:
            body = render_passages(result.passages)
        if len(results) > 1:
            body = f"Query: {' '.join(neutralise(result.sub_query).split())}\n{body}"
        blocks.append(body)
    if note:
        blocks.append(in_place(neutralise(note)))
    return "\n\n<information>" + "\n".join(blocks).strip() + "</information>\n\n"
