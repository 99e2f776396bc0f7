"""Final-answer extraction from a completion: linear-time scans, no backtracking regexes.

Strategies are tried in order and the first that finds something wins. Built-in names:
    answer_line   the last line `ANSWER: <value>`
    boxed         the last balanced \\boxed{...} / \\fbox{...}; boxes separated only by
                  "and"/"or"/commas are joined into one list answer, so hedges stay visible
    gsm8k         the last `#### <value>` line
    final_answer  "Final Answer: The final answer is X. I hope it is correct."; a display block
                  (\\[ ... \\] or $$ ... $$) right after the heading is the value
    final_line    the value the last line states: after "answer is" / "answer:" (`**Final
                  Answer:** **17**`, `The answer is __17__`), the whole line in bold
                  (`**17**`), or a display block after a final-answer heading; never a bold
                  number inside other prose
    last_math     the last $...$, $$...$$, \\(...\\) or \\[...\\] span (joined like boxes)
    last_value    like last_math, but a bare number written after the last span wins
                  ("... $x=3$ ... Therefore there are 12 ways." -> 12); None without spans
    whole         the entire text, when it is short and parses as an answer by itself
    last_number   the last number (or simple fraction) in the text
Any other string is a regular expression with one group, matched line by line from the end.
Whatever a strategy finds is returned without its presentation (scorers.math._parse's
`strip_presentation`: heading, emphasis markers, display delimiters around the value).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from scorers.math._parse import HEADING, UNIT_WORDS, strip_presentation

DEFAULT_PATTERNS: tuple[str, ...] = ("answer_line", "boxed", "gsm8k", "final_line")
# Tail scanned by the free-text strategies: a final answer sits at the end of a completion,
# and a bounded window keeps lazy matching linear even on megabyte inputs.
TAIL_CHARS = 20_000
MAX_BOXES = 64
MAX_BOX_CHARS = 10_000

_ANSWER_LINE = re.compile(
    r"^[ \t*#>_]*answer[ \t*_]*:[ \t*_]*(\S.*)$", re.IGNORECASE | re.MULTILINE
)
_GSM8K = re.compile(r"^[ \t]*####[ \t]*(\S.*)$", re.MULTILINE)
_MATH_SPAN = re.compile(
    r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\(([^\n]+?)\\\)|(?<!\\)\$((?:[^$\n\\]|\\.)+?)\$", re.DOTALL
)
# Not inside a word or a number, nor a subscript (x_1); `__17__` (emphasis) is the number 17.
_NUMBER = re.compile(
    r"(?<![A-Za-z\d])(?<![A-Za-z\d]_)-?(?:\d{1,3}(?: \d{3})+(?!\d)|\d[\d,]*(?:\.\d+)?|\.\d+)(?:[ \t]*/[ \t]*\d+(?:\.\d+)?)?"
)
_PROSE_WORD = re.compile(
    r"(?<![\\a-zA-Z])(?!(?:and|or|sin|cos|tan|sec|csc|cot|log|exp|sqrt|frac|pi)\b)[a-zA-Z]{3,}"
)
# Words that make a number in a sentence something other than the answer itself.
_QUALIFIERS = frozenset(
    """
    not no never neither nor cannot except without approximately approx about around roughly
    nearly almost least most more less fewer over under between than maybe perhaps probably
    possibly either estimate estimated
    """.split()
)
_NUMBER_WORDS = frozenset(
    """
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty
    ninety hundred thousand million billion half third quarter twice double triple once
    """.split()
)
# After "answer" on the final line: "is" or a colon, with emphasis markers around them.
_AFTER_ANSWER = re.compile(r"[ \t*_]*(?:(?<=[ \t])is|:)(?![a-zA-Z0-9])[ \t*_:]*", re.IGNORECASE)
# The end of the sentence stating the answer ("3! \\times 5!" is not one).
_STATEMENT_END = re.compile(r"[.?](?=\s)|!(?=\s+[A-Z])")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
_BOX_GAP_WORDS = re.compile(r"\b(?:and|or)\b|[,;]", re.IGNORECASE)
_GAP_CONTENT = re.compile(r"[A-Za-z0-9=<>]")


def extract_answer(text: str, patterns: Sequence[str] = DEFAULT_PATTERNS) -> str | None:
    """The final answer in `text`, or None when no strategy finds one.

    Args:
        text: the model's completion (any size; scanning is linear).
        patterns: strategy names (see module docstring) or regexes with one capture group.
    """
    for pattern in patterns:
        found = _STRATEGIES[pattern](text) if pattern in _STRATEGIES else _regex(text, pattern)
        if found is not None:
            found = strip_presentation(found)
            if found:
                return found
    return None


def _last_line(text: str, rx: re.Pattern[str]) -> str | None:
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        m = rx.match(text, start, end)
        if m:
            return m.group(1).strip()
        end = start - 1
    return None


def _answer_line(text: str) -> str | None:
    return _last_line(text, _ANSWER_LINE)


def _gsm8k(text: str) -> str | None:
    return _last_line(text, _GSM8K)


def _regex(text: str, pattern: str) -> str | None:
    return _last_line(text, re.compile(pattern, re.MULTILINE))


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """The last MAX_BOXES balanced boxes as (start, end, content), in text order."""
    found: list[tuple[int, int, str]] = []
    pos = len(text)
    for _ in range(MAX_BOXES):
        b = text.rfind("\\boxed", 0, pos)
        f = text.rfind("\\fbox", 0, pos)
        start = max(b, f)
        if start < 0:
            break
        pos = start
        j = start + (6 if start == b else 5)
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            end = _close_brace(text, j)
            if end is None:
                continue
            found.append((start, end + 1, text[j + 1 : end]))
        else:
            m = re.compile(r"[^\s$]+").match(text, j)
            if m:
                found.append((start, m.end(), m.group()))
    return found[::-1]


def _close_brace(text: str, open_at: int) -> int | None:
    depth = 0
    k = open_at
    # A box holding more than MAX_BOX_CHARS is not a final answer; the cap keeps scanning linear.
    n = min(len(text), open_at + MAX_BOX_CHARS)
    while k < n:
        c = text[k]
        if c == "\\":
            k += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return k
        k += 1
    return None


def _boxed(text: str) -> str | None:
    boxes = _boxes(text)
    if not boxes:
        return None
    # Nested boxes (\boxed{\boxed{x}}): keep only outermost ones.
    outer: list[tuple[int, int, str]] = []
    for box in boxes:
        if outer and box[0] < outer[-1][1]:
            continue
        outer.append(box)
    return _join(text, outer)


def _join(text: str, spans: list[tuple[int, int, str]]) -> str:
    """The last span, plus the spans before it that are joined to it only by and/or/commas.

    "\\boxed{1} and \\boxed{2}" is the answer "1, 2"; a hedge "\\boxed{4} or \\boxed{5}" thus
    stays a two-element answer that cannot equal a single reference.
    """
    outer = spans
    chosen = [outer[-1]]
    for prev in reversed(outer[:-1]):
        gap = text[prev[1] : chosen[0][0]]
        if len(gap) > 200:
            break
        gap_clean = re.sub(
            r"\\(?:text|mbox|textnormal)\{([^{}]*)\}|\\quad|\\qquad|\$|\\[()\[\]]", r" \1 ", gap
        )
        if len(gap_clean) > 60:
            break
        # Joined: boxes separated by and/or/commas (a hedge stays a two-element answer) or by
        # nothing but symbols ("\\boxed{35} ++++ \\boxed{4}"). Not joined: words or a relation
        # between them ("\\boxed{4} then \\boxed{5}" is a correction; "= \\boxed{5}" a result).
        if not (_BOX_GAP_WORDS.search(gap_clean) or not _GAP_CONTENT.search(gap_clean)):
            break
        chosen.insert(0, prev)
    parts = list(dict.fromkeys(c[2].strip() for c in chosen))
    return ", ".join(parts)


def _final_answer(text: str) -> str | None:
    tail = text[-TAIL_CHARS:]
    at = tail.lower().rfind("final answer")
    if at < 0:
        return None
    seg = tail[at + len("final answer") :].lstrip(" \t\n:*#_")
    block = _display_block(seg)
    if block is not None:  # "## Final Answer\n\\[\n x \\ge 3\n\\]"
        return _boxed(block) or block
    seg = seg.split("\n", 1)[0].split("<|", 1)[0]
    hope = seg.lower().find("i hope it is correct")
    if hope >= 0:
        seg = seg[:hope]
    boxed = _boxed(seg)
    if boxed is not None:
        return boxed
    seg = " " + seg
    is_at = seg.rfind(" is ")
    seg = seg[is_at + 4 :] if is_at >= 0 else seg
    spans = _math_span_pos(seg)
    if spans:  # "is $12$ and $13$": one two-element answer, like joined boxes
        return _join(seg, spans)
    value = seg.strip().rstrip(".")
    return _sole_number(value) or value


def _display_block(seg: str) -> str | None:
    """The content of a display block (`\\[ … \\]`, `$$ … $$`) that `seg` starts with."""
    for open_, close in (("\\[", "\\]"), ("$$", "$$")):
        if seg.startswith(open_):
            end = seg.find(close, len(open_), MAX_BOX_CHARS)
            return seg[len(open_) : end] if end > 0 else None
    return None


def _final_line(text: str) -> str | None:
    """The value the last non-empty line states as the answer.

    Either after "answer is" / "answer:" on that line (a final-answer heading such as
    `**Final Answer:** **17**`, or "So the answer is __17__."), or as the whole line in bold
    (`**17**`, after a verification paragraph full of other numbers). A bold number inside other
    prose ("we found **3** cases, so the total is 12") is never taken. A value in words goes
    through the `final_answer` rule: one number and no qualifier ("not 17", "about 17").
    """
    tail = text[-TAIL_CHARS:].rstrip()
    block = _final_block(tail)
    if block is not None:
        return block
    line = tail[tail.rfind("\n") + 1 :].strip().rstrip(".!").rstrip()
    at = line.lower().rfind("answer")
    if at >= 0 and (at == 0 or not line[at - 1].isalnum()):
        m = _AFTER_ANSWER.match(line, at + len("answer"))
        if m:
            stop = _STATEMENT_END.search(line, m.end())  # "17. I hope it is correct"
            end = stop.start() if stop else len(line)
            if any(c.isdigit() for c in line[end:]):
                return None  # "The answer is 17. Or maybe 18.": a hedge or a correction
            return _stated_value(line[m.end() : end], headed=":" in m.group())
    for marker in ("**", "__"):
        inner = line[len(marker) : -len(marker)].strip(marker[0])
        if line.startswith(marker) and line.endswith(marker) and marker not in inner:
            return _stated_value(line)
    return None


def _final_block(tail: str) -> str | None:
    """A display block ending the text right after a final-answer heading:
    "**Final Answer**\n$$x \\ge 3$$", "## Final Answer\n\\[\n x \\ge 3\n\\]"."""
    for open_, close in (("\\[", "\\]"), ("$$", "$$")):
        if not tail.endswith(close):
            continue
        start = tail.rfind(open_, max(0, len(tail) - MAX_BOX_CHARS), len(tail) - len(close))
        if start < 0:
            continue
        before = tail[:start].rstrip()
        head = before[before.rfind("\n") + 1 :]
        lead = head.rstrip(" \t*_").lower()
        if HEADING.fullmatch(head) or lead.endswith(("answer is", "answer:", "answer is:")):
            return tail[start + len(open_) : len(tail) - len(close)].strip() or None
    return None


def _stated_value(written: str, *, headed: bool = False) -> str | None:
    value = strip_presentation(written)
    words = [w for w in _PROSE_WORD.findall(value) if w.lower() not in UNIT_WORDS]
    if not words:
        return value or None
    if any(c.isdigit() for c in value):
        return _sole_number(value)
    # One word in bold or after "Answer:" is an answer ("**odd**"); after "the answer is" it
    # rarely is ("the answer is correct"), and a sentence without a number is not.
    marked = headed or written.rstrip().endswith(("**", "__"))
    return value if marked and len(value.split()) == 1 else None


def _sole_number(sentence: str) -> str | None:
    """The number a prose sentence states ("Jane started Sphere 3 hours ago" -> "3").

    Only when it is the sentence's one number, and no word negates, bounds or hedges it
    ("not 3", "at least 3", "about 3") or could be a second number in words ("3 of the two").
    """
    words = [w.lower() for w in _PROSE_WORD.findall(sentence)]
    if not any(w not in UNIT_WORDS for w in words):
        return None  # not prose: "3 hours" is parsed as an answer as it stands
    if any(w in _QUALIFIERS or w in _NUMBER_WORDS for w in words) or "n't" in sentence:
        return None
    numbers = _NUMBER.findall(sentence)
    return numbers[0].rstrip(",") if len(numbers) == 1 else None


def _math_span_pos(text: str) -> list[tuple[int, int, str]]:
    return [
        (m.start(), m.end(), next(g for g in m.groups() if g is not None))
        for m in _MATH_SPAN.finditer(text)
    ]


def _last_math(text: str) -> str | None:
    tail = text[-TAIL_CHARS:]
    spans = _math_span_pos(tail)
    return _join(tail, spans) if spans else None


def _whole(text: str) -> str | None:
    from scorers.math._parse import ParseError, parse_answer

    if len(text) > 300 or "\n" in text.strip():
        return None
    words = _PROSE_WORD.findall(text)
    if words and any(c.isdigit() for c in text):
        return None  # prose around a number ("the answer is not 10 but 12"): not an answer
    try:
        parse_answer(text)
    except ParseError:
        return None
    return text


def _last_value(text: str) -> str | None:
    """The last math span, or a bare number written after it when that is the last value.

    "... $d = \\frac{90}{n}$ ... Therefore, there are 12 sequences." -> "12". None when the
    text has no math span at all: then `whole` and `last_number` are the strategies to use. A
    number in a sentence that negates or hedges it ("so 12 is not divisible by 5") is refused.
    """
    tail = text[-TAIL_CHARS:]
    spans = _math_span_pos(tail)
    if not spans:
        return None
    after = spans[-1][1]
    last = None
    for m in _NUMBER.finditer(tail, after):
        last = m
    if last is None:
        return _join(tail, spans)
    start = after
    for m in _SENTENCE_END.finditer(tail, after, last.start()):
        start = m.end()
    stop = _SENTENCE_END.search(tail, last.end())
    sentence = tail[start : stop.start() if stop else len(tail)]
    words = {w.lower() for w in _PROSE_WORD.findall(sentence)}
    if words & _QUALIFIERS or "n't" in sentence:
        return None
    return last.group().rstrip(",")


def _last_number(text: str) -> str | None:
    last = None
    for m in _NUMBER.finditer(text[-TAIL_CHARS:]):
        last = m.group()
    return last.rstrip(",") if last else None


_STRATEGIES = {
    "answer_line": _answer_line,
    "boxed": _boxed,
    "gsm8k": _gsm8k,
    "final_answer": _final_answer,
    "final_line": _final_line,
    "last_math": _last_math,
    "last_value": _last_value,
    "last_number": _last_number,
    "whole": _whole,
}
