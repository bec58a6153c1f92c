"""What a gold passage says for its step: the reading the gold teacher's think turns quote (``training.turns``).

Pure text functions over corpus ``contents`` (a quoted title line, then the passage): the sentence naming a bridge
entity or the answer (``quote``), a compared entity's first sentence and the one sharing the question's words
(``quote_for``), the date a comparison about time reads (``asked_date``), a finding as a number to compare
(``finding_value``), the country a sentence names (``nation_in``) and the longest phrase of a question a quote holds
(``asked_phrase``).
"""

from __future__ import annotations

import itertools
import re

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"

_DATE_RE = re.compile(
    rf"\b(?:(?:{_MONTHS}) \d{{1,2}}, \d{{3,4}}|\d{{1,2}} (?:{_MONTHS}) \d{{3,4}}|(?:{_MONTHS}) \d{{3,4}}|"
    r"(?:1[0-9]|20)\d\d)\b"
)

#: Comparison questions about time: the value to quote from each passage is its first date.
TIME_WORDS = re.compile(
    r"\b(born|older|oldest|younger|youngest|first|earlier|earliest|later|latest|founded|established|formed|"
    r"released|published|died|opened|created|started|began|came out|longer|newer|recent|recently|before|after)\b",
    re.IGNORECASE,
)

#: The extreme a comparison asks for, by the words that say it: of a date (about time) or of a quantity.
_DIRECTIONS = {
    True: {
        "earliest": r"older|oldest|first|earlier|earliest|before",
        "latest": r"younger|youngest|later|latest|newer|newest|recent|recently|last|after",
    },
    False: {
        "largest": r"larger|largest|bigger|biggest|higher|highest|taller|tallest|longer|longest|more|most|greater|"
        r"greatest|heavier|heaviest|deeper|deepest|wider|widest",
        "smallest": r"smaller|smallest|lower|lowest|shorter|shortest|less|least|fewer|fewest|lighter|lightest|"
        r"shallower|narrower",
    },
}


def asked_direction(question: str, about_time: bool) -> str | None:
    """The extreme ``question`` asks for (``earliest``/``latest`` about time, ``smallest``/``largest`` else), from
    its words; None when they name none, or both."""
    found = {
        direction
        for direction, words in _DIRECTIONS[about_time].items()
        if re.search(rf"\b(?:{words})\b", question, re.IGNORECASE)
    }
    return found.pop() if len(found) == 1 else None


_DEATH_WORDS = re.compile(r"\b(died|death|passed away)\b", re.IGNORECASE)  # not "die": "Die Hard" is a title

#: a passage's life span (or run) of two dates: ``(3 May 1901 – 9 June 1970)``, ``(1901-1970)``
_RANGE_RE = re.compile(rf"({_DATE_RE.pattern})\s*[–—-]\s*({_DATE_RE.pattern})")

_MAX_QUOTE_WORDS = 24


def normalised(text: str) -> str:
    """Lower-case words of letters and digits, one space apart: what two spellings of a name share."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def asks_same(question: str) -> bool:
    """Whether a yes/no question asks if two things are the same ("Do X and Y have the same nationality?"); the
    others ask whether both have a property ("Are X and Y both magazines?")."""
    return bool(re.search(r"\bsame\b", question, re.IGNORECASE))


def mentioned(title: str, question: str) -> bool:
    """A supporting title (its parenthesised qualifier dropped) appears in the question."""
    name = normalised(re.sub(r"\(.*?\)", "", title))
    return bool(name) and f" {name} " in f" {normalised(question)} "


def plain_title(title: str) -> str:
    """A title without its parenthesised qualifier: ``Unbreakable (film)`` → ``Unbreakable``."""
    return re.sub(r"\s*\(.*?\)", "", title).strip() or title


def passage_body(contents: str) -> str:
    """A corpus passage's text without its quoted title line."""
    return contents.split("\n", 1)[1] if contents.startswith('"') and "\n" in contents else contents


#: words whose period does not end a sentence: titles and other abbreviations that precede a name or a number
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "mt", "ft", "no", "nos", "vs", "inc", "ltd", "co", "corp", "bros",
    "gen", "col", "lt", "sgt", "capt", "cmdr", "adm", "gov", "sen", "rep", "rev", "prof", "hon", "pres",
})  # fmt: skip

#: what a piece ends on when its period is not a sentence's end: an initial (``Michael P.``), a dotted acronym
#: (``U.S.``) or an abbreviation (``Dr.``)
_NOT_AN_END = re.compile(r"(?:^|[\s(\"'])(?:[A-Z]|(?:[A-Za-z]\.)+[A-Za-z]|([A-Za-z]+))\.$")


def _sentences(text: str) -> list[str]:
    """A passage's sentences; a name's initial or an abbreviation ("Charles H. Ferguson", "U.S. Army", "Dr. No")
    does not end one."""
    sentences: list[str] = []
    for piece in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", text):
        end = _NOT_AN_END.search(sentences[-1]) if sentences else None
        if end and (end.group(1) is None or end.group(1).lower() in _ABBREVIATIONS):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    return [s.strip() for s in sentences if s.strip()]


def _clip(sentence: str, around: str | None = None) -> str:
    """A sentence cut to about ``_MAX_QUOTE_WORDS`` words, keeping ``around`` (a name or value it holds) inside; the
    cut falls between names and dates, not inside one ("the Gulf of" for "the Gulf of Tonkin", "1 June" for "1 June
    1941"), and the piece ends on neither a function word nor a comma (``_trim``)."""
    words = sentence.rstrip(".").split()
    if len(words) <= _MAX_QUOTE_WORDS:
        return " ".join(words)
    start, keep = 0, None
    found = around and (
        re.search(rf"\b{re.escape(around)}\b", sentence, re.IGNORECASE)
        or re.search(re.escape(around), sentence, re.IGNORECASE)
    )
    if found:  # the whole name, not its first word inside another ("King" in "Kingdom")
        at = len(sentence[: found.start()].split())
        keep = (at, at + len(found.group(0).split()))
        start = max(0, min(at - _MAX_QUOTE_WORDS // 2, len(words) - _MAX_QUOTE_WORDS))
    end, limit = start + _MAX_QUOTE_WORDS, start + _MAX_QUOTE_WORDS // 4  # a name that long is cut where it falls
    while start > 0 and start < limit and _joined(words, start) and (keep is None or start < keep[0]):
        start += 1  # past the cut name
    limit = end - _MAX_QUOTE_WORDS // 4
    while end < len(words) and end > limit and _joined(words, end) and (keep is None or end > keep[1]):
        end -= 1  # before the cut name
    return _trim(words[start:end], keep[1] - start if keep else 0)


#: lowercase words inside a name or a date: "Gulf of Tonkin", "Charles de Gaulle", "Game of Thrones"
_NAME_LINKS = frozenset({"of", "the", "de", "da", "del", "der", "di", "du", "la", "le", "van", "von", "y", "and", "&"})


def _name_word(word: str) -> bool:
    return word[:1].isupper() or word[:1].isdigit()


def _joined(words: list[str], i: int) -> bool:
    """Whether ``words[i - 1]`` and ``words[i]`` belong to one name or date (``words[i - 1]`` ends on no comma)."""

    def name(j: int) -> bool:
        return 0 <= j < len(words) and _name_word(words[j])

    def link(j: int) -> bool:
        return 0 <= j < len(words) and words[j] in _NAME_LINKS

    if words[i - 1][-1:] in ",;:)":
        return False
    return (
        (name(i - 1) and name(i))
        or (link(i) and name(i - 1) and name(i + 1))
        or (link(i - 1) and name(i - 2) and name(i))
    )


def _trim(words: list[str], kept: int) -> str:
    """``words`` without the function words and the comma they end on (beyond the first ``kept``)."""
    while len(words) > max(kept, 1) and (
        words[-1].lower().strip(",;:") in _STOPWORDS or words[-1].lower().strip(",;:") in _NAME_LINKS
    ):
        words = words[:-1]
    return " ".join(words).rstrip(",;:").rstrip(".")  # the turn puts its own period after it


def quote(contents: str, must: str | None = None) -> str:
    """What a passage says, in one clipped sentence: the first that names ``must`` (a bridge entity or the
    answer), else the first sentence."""
    sentences = _sentences(passage_body(contents)) or [passage_body(contents)]
    if must:
        key = normalised(must)
        for sentence in sentences:
            if key and f" {key} " in f" {normalised(sentence)} ":
                return _clip(sentence, must)
    return _clip(sentences[0])


_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "been", "both", "by", "did", "do", "does", "for", "from", "had",
    "has", "have", "he", "her", "his", "in", "is", "it", "its", "more", "most", "of", "on", "or", "same", "she",
    "than", "that", "the", "their", "them", "these", "they", "this", "those", "to", "was", "were", "what",
    "which", "who", "whom", "whose", "with",
})  # fmt: skip


def key_words(text: str, singular: bool = False) -> set[str]:
    """A text's content words, cut to five letters so that ``retains`` meets ``retaining`` (``singular``: a
    plural's ``s`` dropped first, so that ``bands`` meets ``band``)."""
    words = [w for w in normalised(text).split() if len(w) > 2 and w not in _STOPWORDS]
    return {(w.rstrip("s") if singular else w)[:5] for w in words}


def quote_for(contents: str, question: str, name: str) -> str:
    """What a compared entity's passage says for ``question``: its first sentence (who or what ``name`` is),
    followed by the sentence that shares the most of the question's other words, when that is another one
    ("It retains a Baroque style" for "Which mosque is unique for retaining a Baroque style?"): the first
    sentence says what the entity is, often not the attribute the comparison asks about."""
    sentences = _sentences(passage_body(contents)) or [passage_body(contents)]
    asked = key_words(question) - key_words(name)
    shared = [len(key_words(s) & asked) for s in sentences]
    best = max(range(len(sentences)), key=lambda i: (shared[i], -i))
    first = _clip(sentences[0])
    return first if shared[best] <= shared[0] else f"{first}; {_clip(sentences[best])}"


def asked_phrase(question: str, text: str, names: set[str] = frozenset()) -> str | None:
    """The longest run of the question's words that ``text`` also holds (case and punctuation aside), as the
    question writes it, without stopwords at either end, and holding two content words or more that are not
    ``names`` (``key_words`` of the entities searched): ``Italian-American composer and librettist``, not
    ``actor`` or ``novel by``. None when there is none."""
    tokens = [(word, normalised(word)) for word in question.split()]
    body = f" {normalised(text)} "
    best: list[tuple[str, str]] = []
    for i in range(len(tokens)):
        for j in range(len(tokens), i + len(best), -1):  # the longest run from i first, longer than the best
            run = " ".join(norm for _, norm in tokens[i:j] if norm)
            if run and f" {run} " in body:
                best = tokens[i:j]
                break
    while best and best[0][1] in _STOPWORDS | {""}:
        best = best[1:]
    while best and best[-1][1] in _STOPWORDS | {""}:
        best = best[:-1]
    if len(key_words(" ".join(norm for _, norm in best)) - names) < 2:
        return None
    return " ".join(word for word, _ in best).replace('"', "").strip(" ?,.;:!'")


#: a year run into the next date, as 2Wiki prints life spans: ``( 25 October 188910 November 1981)``
_GLUED_DATES_RE = re.compile(rf"(?<!\d)((?:1[0-9]|20)\d\d)(\d{{1,2}} (?:{_MONTHS})\b)")


def _dated_body(contents: str) -> str:
    """A passage's body with glued dates apart (``1889 – 10 November``), so its first date is the first one."""
    return _GLUED_DATES_RE.sub(r"\1 – \2", passage_body(contents))


def first_date(contents: str) -> str | None:
    """The first date or year a passage states (``14 March 1879``, ``March 14, 1879``, ``1879``), or None."""
    found = _DATE_RE.search(_dated_body(contents))
    return found.group(0) if found else None


def asked_date(contents: str, question: str) -> str | None:
    """The date a comparison about time reads from a passage: for a question about deaths ("Who died first?"),
    the second date of the passage's first range (``Jo Park (3 May 1901 – 9 June 1970)`` → ``9 June 1970``),
    None without a range (a living person, or dates the passage does not pair); else its first date."""
    if not _DEATH_WORDS.search(question):
        return first_date(contents)
    found = _RANGE_RE.search(_dated_body(contents))
    return found.group(2) if found else None


#: the units a synthetic world's quantities are stated in
_UNITS = "(?:cm|metres|square kilometres)"


def finding_value(finding: str | None) -> int | None:
    """A finding that is a bare number, a number with its unit (``1,250 square kilometres``) or a date, as a
    number to compare (a date's year); None for text."""
    if not finding:
        return None
    if number := re.fullmatch(rf"(\d[\d,]*)(?: {_UNITS})?", finding):
        return int(number.group(1).replace(",", ""))
    return int(re.findall(r"\d{3,4}", finding)[-1]) if _DATE_RE.fullmatch(finding) else None


#: Countries and the words that name them (demonyms, regions that would read as another country), one per line,
#: for a "same country / nationality" check on quoted sentences.
_NATIONS_TEXT = """
United States: american, united states, u s, usa, new mexico, new england
United Kingdom: british, english, scottish, welsh, united kingdom, uk, england, scotland, wales
Canada: canadian, canada, british columbia
Australia: australian, australia, new south wales
New Zealand: new zealand
Ireland: irish, ireland
France: french, france
Germany: german, germany, west german, east german
Italy: italian, italy
Spain: spanish, spain
Portugal: portuguese, portugal
Netherlands: dutch, netherlands
Belgium: belgian, belgium
Switzerland: swiss, switzerland
Austria: austrian, austria
Sweden: swedish, sweden
Norway: norwegian, norway
Denmark: danish, denmark
Finland: finnish, finland
Poland: polish, poland
Czech Republic: czech
Hungary: hungarian, hungary
Greece: greek, greece
Russia: russian, russia, soviet
Ukraine: ukrainian, ukraine
Turkey: turkish, turkey
Iran: iranian, iran, persian
India: indian, india
Pakistan: pakistani, pakistan
China: chinese, china
Japan: japanese, japan
South Korea: south korean, korean, south korea, korea
Philippines: filipino, philippines
Indonesia: indonesian, indonesia
Israel: israeli, israel
Egypt: egyptian, egypt
Nigeria: nigerian, nigeria
South Africa: south african, south africa
Botswana: botswana
Cape Verde: cape verdean, cape verde
Mexico: mexican, mexico
Brazil: brazilian, brazil
Argentina: argentine, argentinian, argentina
Chile: chilean, chile
Colombia: colombian, colombia
Venezuela: venezuelan, venezuela
Cuba: cuban, cuba
Croatia: croatian, croatia
Serbia: serbian, serbia
Romania: romanian, romania
Bulgaria: bulgarian, bulgaria
"""

_NATION_OF = {
    word: country
    for country, words in (line.split(": ") for line in _NATIONS_TEXT.strip().splitlines())
    for word in words.split(", ")
}


def _demonyms(country: str, words: str) -> list[str]:
    """The words of a line of ``_NATIONS_TEXT`` before the country's own name: its demonyms."""
    name = normalised(country)
    return list(itertools.takewhile(lambda word: word != name, words.split(", ")))


#: ``american``, ``south korean``: what ``demonym`` answers with
_DEMONYMS = frozenset(word for line in _NATIONS_TEXT.strip().splitlines() for word in _demonyms(*line.split(": ")))

_NATION_RE = re.compile(r"\b(" + "|".join(sorted(_NATION_OF, key=len, reverse=True)) + r")\b")


def nation_in(text: str) -> str | None:
    """The first country a sentence names or implies by a demonym (``a Chilean film director`` → Chile)."""
    found = _NATION_RE.search(normalised(text))
    return _NATION_OF[found.group(1)] if found else None


def demonym(text: str) -> str | None:
    """The demonym a text's first country is named by (``a Chilean film director`` → Chilean), or None where it is
    named otherwise (``born in Chile``) or not at all."""
    found = _NATION_RE.search(normalised(text))
    return found.group(1).title() if found and found.group(1) in _DEMONYMS else None
