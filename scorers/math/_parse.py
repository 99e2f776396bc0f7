"""A non-evaluating parser for final answers written in LaTeX or plain math.

Model output is hostile, so nothing here calls eval/exec/sympify/parse_expr: a hand-written
tokenizer and Pratt parser turn the text into a small tree of plain tuples (picklable, cheap to
send to the worker process). Limits on length, tokens, nesting and literal size are checked
while tokenizing, before any tree is built, so a hostile string costs linear time at most.

Tree nodes (tuples, first item is the kind):
    ("num", Fraction)            exact decimal / integer literal
    ("sym", name)                variable or constant name ("pi", "e", "i", "oo" for infinity)
    ("add", [nodes]) ("mul", [nodes]) ("neg", x) ("div", a, b) ("pow", a, b) ("fact", x)
    ("pm", a, b)                 a ± b (b alone for unary ±: a is None)
    ("func", name, [args])       sqrt, root, sin, log, abs, ...; unknown names stay symbolic
    ("tuple", [nodes]) ("set", [nodes]) ("list", [nodes])   list = bare comma list
    ("interval", lo, hi, lo_closed, hi_closed) ("union", [nodes]) ("matrix", [[nodes]])
    ("rel", [ops], [nodes])      chained relation, ops in = < <= > >= != ~ in
    ("percent", x)               x written with % (or "percent"): see scorers.math._compare
    ("ratio", [nodes])           a:b
    ("bigop", "sum"|"prod", var, lo, hi, body)   \\sum_{var=lo}^{hi} body, never evaluated
    ("text", words)              a textual answer, normalised
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 20_000
MAX_TOKENS = 4_000
MAX_DEPTH = 64
MAX_DIGITS = 2_000


class ParseError(ValueError):
    """The text is not a math answer this parser understands."""


class LimitExceeded(ParseError):
    """The text exceeds a size, nesting or magnitude limit."""


# Formatting noise removed before tokenizing. Each pattern is a literal or a simple class, so
# every substitution is linear in the input.
_PRE_SUBS: list[tuple[re.Pattern[str], str]] = [
    # Over-escaped LaTeX (\\frac from JSON-in-JSON) is the same command.
    (re.compile(r"(?<!\\)\\\\(?=[a-zA-Z])"), r"\\"),
    (re.compile(r"\\(?:d|t|c)frac"), r"\\frac"),
    (re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])\.?"), ""),
    (re.compile(r",\\!\s*"), ","),
    # {,} is LaTeX's spacing-free comma (14{,}916); model output often pads it: 14 {, }916.
    (re.compile(r"\s*\{\s*,\s*\}\s*"), ","),
    (re.compile(r"\\q?quad|\\(?:!|,|;|:|displaystyle|textstyle|limits)(?![a-zA-Z])"), " "),
    (re.compile(r"(?<!\\)\\ "), " "),
    (re.compile(r"~"), " "),
    (re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree"), ""),
    (re.compile(r"\\\$|\$|€|£|\\euro"), ""),
    (re.compile(r"\\%|%"), " percent "),
    (re.compile(r"(?<=\d) (?=\d{3}(?!\d))"), ""),
]
_UNICODE = str.maketrans(
    {
        "\u2212": "-",
        "\u2013": "-",
        "\u00d7": "*",
        "\u22c5": "*",
        "\u00b7": "*",
        "\u00f7": "/",
        "\u2264": "<=",
        "\u2265": ">=",
        "\u2260": "!=",
        "\u00b1": "\\pm ",
        "\u221e": "\\infty ",
        "\u03c0": "\\pi ",
        "\u2248": "\\approx ",
        "\u221a": "\\sqrt ",
        "\u2208": "\\in ",
        "\u222a": "\\cup ",
        "\u00a0": " ",
        # JSON-decoded "\f" / "\b" of an under-escaped \frac / \boxed.
        "\x0c": "\\f",
        "\x08": "\\b",
        "\u2009": " ",
        "\u202f": " ",
    }
)

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|\d+(?:\.\d*)?(?:[eE][-+]?\d+(?![a-zA-Z]))?|\.\d+)
  | (?P<cmd>\\[a-zA-Z]+|\\[{}|\\])
  | (?P<word>[a-zA-Z]+)
  | (?P<op><=|>=|!=|==|=<|=>|->|[-+*/^_()\[\]{}|,;=<>!':&.?])
    """,
    re.VERBOSE,
)

_OPEN = {"(": ")", "[": "]", "{": "}", "\\{": "\\}", "\\lbrace": "\\rbrace", "\\langle": "\\rangle"}
_CLOSE = {")", "]", "}", "\\}", "\\rbrace", "\\rangle"}

# Multi-letter words that are units or filler after a number: dropped, never multiplied in.
UNIT_WORDS = frozenset(
    """
    cm mm km meter meters metre metres inch inches in ft foot feet yard yards mile miles
    square sq cubic units unit degree degrees deg radians radian rad cents cent dollars dollar
    yuan euros euro pounds pound kg gram grams kilograms liters litres liter ml hours hour
    hr hrs minutes minute mins seconds second days day weeks week months month years
    year people persons students ways times points percent pct percentage mph kmh km/h
    """.split()
)
# Markers of a value written as a percentage: kept in the tree (not dropped like other units).
PERCENT_WORDS = frozenset(("percent", "pct", "percentage"))

FUNCTIONS = frozenset(
    """
    sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh log ln exp sqrt abs
    """.split()
)
GREEK = frozenset(
    """
    alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi
    rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega
    """.split()
)
_TEXT_CMDS = frozenset(
    "text textbf textit textrm textnormal mathrm mathbf mathit mathsf mathtt mbox operatorname "
    "boxed fbox hbox emph textsf texttt mathbb mathcal".split()
)
_REL_CMDS = {
    "\\le": "<=",
    "\\leq": "<=",
    "\\leqslant": "<=",
    "\\ge": ">=",
    "\\geq": ">=",
    "\\geqslant": ">=",
    "\\lt": "<",
    "\\gt": ">",
    "\\ne": "!=",
    "\\neq": "!=",
    "\\approx": "~",
    "\\sim": "~",
    "\\simeq": "~",
    "\\in": "in",
    "\\equiv": "=",
    "\\to": "->",
    "\\rightarrow": "->",
}
_REL_OPS = {"=": "=", "==": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "=<": "<=",
            "=>": ">=", "!=": "!="}  # fmt: skip


# A final-answer heading before the value: "**Final Answer:**", "## Final Answer\n", "The answer
# is", "Answer:" (a bare "Answer" only before a colon or a line break). Anchored and built from
# literals and single classes, so matching is linear.
HEADING = re.compile(
    r"[\s#>*_]*(?:(?:the\s+)?final\s+answer(?:\s+is)?|(?:the\s+)?answer\s+is"
    r"|answer(?=[ \t*_]*(?::|\n)))(?![a-zA-Z0-9])[\s*_:]*",
    re.IGNORECASE,
)
# Display math around the whole value; inline \( \) only on one line, as inline math is.
_DISPLAY = (("\\[", "\\]"), ("\\(", "\\)"))
# First and last characters of anything strip_presentation removes.
_MAY_OPEN = frozenset("#>*_\\$tTfFaA")
_MAY_CLOSE = frozenset("*_.$])")


def strip_presentation(text: str) -> str:
    """The value inside its presentation: a final-answer heading, emphasis (`**17**`, `__17__`)
    and display-math delimiters (`\\[ … \\]`, `$$ … $$`) around it are not part of the answer.

    Only wrappers at the ends are removed: each pass costs one look at both ends, and a few passes
    peel nested wrappers (`**Final Answer:** **$17$**`). Emphasis inside the value is kept.
    """
    s = text.strip()
    if s[:1] not in _MAY_OPEN and s[-1:] not in _MAY_CLOSE:
        return s  # the common case (a plain number or expression), at the cost of two lookups
    for _ in range(6):
        before = s
        m = HEADING.match(s)
        if m and m.end() < len(s):
            s = s[m.end() :]
        if s[-1:] == "." and s[-2:-1] in ("*", "_", "$", "]", ")"):
            s = s[:-1].rstrip()
        # Emphasis markers: a run of * or _ can neither start nor end a math answer, except
        # after ^ or a backslash (z^*, \_).
        s = s.lstrip("*_")
        end = len(s)
        while end > 0 and s[end - 1] in "*_":
            end -= 1
        if end < len(s) and (end == 0 or s[end - 1] not in "^\\"):
            s = s[:end]
        s = s.strip()
        for open_, close in _DISPLAY:
            if s.startswith(open_) and s.endswith(close) and len(s) >= 4:
                if open_ == "\\(" and "\n" in s:
                    continue
                s = s[2:-2].strip()
        if s.startswith("$") and s.endswith("$"):
            s = s.strip("$").strip()
        if s == before:
            break
    return s


def normalize(text: str) -> str:
    """Remove formatting noise (presentation, delimiters, spacing commands, currency, degrees)."""
    if len(text) > MAX_CHARS:
        raise LimitExceeded(f"answer longer than {MAX_CHARS} characters")
    s = strip_presentation(_unbox(strip_presentation(text.translate(_UNICODE))))
    for pattern, repl in _PRE_SUBS:
        s = pattern.sub(repl, s)
    s = s.strip()
    # Trailing sentence punctuation and a dangling backslash are never part of the answer.
    while s and s[-1] in ".\\" and not s.endswith("\\\\"):
        s = s[:-1].rstrip()
    return s


def _unbox(s: str) -> str:
    """Replace each \\boxed{x} / \\fbox{x} by x (the box is presentation, not math)."""
    for _ in range(64):
        at = max(s.find("\\boxed"), s.find("\\fbox"))
        if at < 0:
            return s
        brace = s.find("{", at)
        if brace < 0 or s[at:brace].strip() not in ("\\boxed", "\\fbox"):
            return s
        end = _match_brace(s, brace)
        s = s[:at] + s[brace + 1 : end] + s[end + 1 :]
    return s


def tokenize(text: str) -> list[tuple[str, str]]:
    """Split normalised text into (kind, value) tokens, enforcing the size and nesting limits."""
    tokens: list[tuple[str, str]] = []
    depth = 0
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        value = m.group()
        if kind == "ws":
            continue
        if kind == "num" and depth > 0 and "," in value:
            # Inside brackets a comma separates items: (12,102) is a pair, not 12102.
            pos = m.start() + value.index(",")
            value = value[: value.index(",")]
        if kind == "num" and pos < n and text[pos] == "_":
            # 204_5: a numeral in another base is kept as written, never converted.
            sub = re.compile(r"_\{?(\w+)\}?").match(text, pos)
            if sub:
                pos = sub.end()
                tokens.append(("base", f"{value}_{sub.group(1)}"))
                continue
        if kind == "num":
            digits = sum(c.isdigit() for c in value)
            if digits > MAX_DIGITS:
                raise LimitExceeded(f"number literal longer than {MAX_DIGITS} digits")
        elif kind == "cmd" and value[1:] in _TEXT_CMDS:
            # Read the braced argument verbatim: \text{...} holds words, not math.
            if value[1:] in ("boxed", "fbox", "mathbb", "mathcal"):
                continue  # a box or font around math: the content is tokenized as usual
            j = pos
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j] == "{":
                end = _match_brace(text, j)
                tokens.append(("text", text[j + 1 : end]))
                pos = end + 1
                continue
            if value[1:] == "operatorname":
                continue
        elif value in _OPEN or value in ("\\begin",):
            depth += 1
            if depth > MAX_DEPTH:
                raise LimitExceeded(f"nesting deeper than {MAX_DEPTH}")
        elif value in _CLOSE or value == "\\end":
            depth -= 1
        tokens.append((kind, value))
        if len(tokens) > MAX_TOKENS:
            raise LimitExceeded(f"more than {MAX_TOKENS} tokens")
    return tokens


def _match_brace(text: str, start: int) -> int:
    depth = 0
    for k in range(start, len(text)):
        c = text[k]
        if c == "\\":
            continue
        if c == "{" and (k == 0 or text[k - 1] != "\\"):
            depth += 1
        elif c == "}" and (k == 0 or text[k - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return k
    raise ParseError("unbalanced braces")


def parse_number(value: str) -> Fraction:
    return Fraction(value.replace(",", ""))


def parse_answer(text: str) -> tuple:
    """Parse one final answer into a tree (see the module docstring).

    Raises:
        ParseError: the text is not a math answer; LimitExceeded when over a limit.
    """
    s = normalize(text)
    if not s:
        raise ParseError("empty answer")
    tokens = tokenize(s)
    if not tokens:
        raise ParseError("empty answer")
    if len(tokens) == 1 and tokens[0][0] == "text" and text.strip() != tokens[0][1]:
        # \text{5 units} / \textbf{(C)}: the wrapper is presentation; read what it holds.
        try:
            return parse_answer(tokens[0][1].strip().strip("()") or "()")
        except ParseError:
            return ("text", _text_value(tokens[0][1]).lower())
    if all(k == "word" for k, _ in tokens) and len(tokens) >= 1:
        words = [v for _, v in tokens]
        if len(words) > 1 or (len(words[0]) > 1 and words[0].lower() not in FUNCTIONS):
            kept = [w for w in words if w.lower() not in UNIT_WORDS]
            if len(kept) == 1 and len(kept[0]) == 1:
                return ("sym", kept[0])
            return ("text", " ".join(words).lower())
    return _Parser(tokens).parse_top()


def _text_value(content: str) -> str:
    return " ".join(content.replace("(", " ").replace(")", " ").split())


class _Parser:
    """Pratt parser over the token list. Recursion depth is bounded by MAX_DEPTH (checked in
    tokenize), so deeply nested input is refused before it can exhaust the stack."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.toks = tokens
        self.i = 0

    # -- token helpers -------------------------------------------------------------------
    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "")

    def next(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        tok = self.next()
        if tok[1] != value:
            raise ParseError(f"expected {value!r}, got {tok[1] or 'end of input'!r}")

    def at_separator(self) -> bool:
        kind, value = self.peek()
        if value in (",", ";"):
            return True
        if kind == "word" and value.lower() in ("and", "or"):
            return True
        return kind == "text" and _text_value(value).lower() in ("and", "or", ",")

    # -- grammar -------------------------------------------------------------------------
    def parse_top(self) -> tuple:
        items = self.parse_list(end=None)
        self.skip_trailing_units()
        if self.peek()[0] != "eof":
            raise ParseError(f"unexpected {self.peek()[1]!r}")
        if len(items) == 1:
            return items[0]
        return ("list", items)

    def parse_list(self, end: str | None) -> list[tuple]:
        groups: list[list[tuple]] = [[]]
        while True:
            while self.at_separator():
                if self.next()[1] == ";" and groups[-1]:
                    groups.append([])
            kind, value = self.peek()
            if kind == "eof" or (end is not None and value in end):
                break
            groups[-1].append(self.parse_relation())
            self.skip_trailing_units()
            if not self.at_separator():
                break
        groups = [g for g in groups if g]
        if not groups:
            raise ParseError("empty list")
        width = len(groups[0])
        if end is None and len(groups) > 1 and width > 1 and all(len(g) == width for g in groups):
            # "p=5, q=2; p=7, q=2": semicolons separate solutions, commas their components.
            return [("tuple", g) for g in groups]
        return [item for g in groups for item in g]

    def skip_trailing_units(self) -> None:
        while True:
            kind, value = self.peek()
            if kind == "text" and _text_value(value).lower() not in ("and", "or"):
                self.next()
                if self.peek()[1] == "^":  # \text{ cm}^2
                    self.next()
                    self.parse_atom()
            elif kind == "word" and value.lower() in UNIT_WORDS:
                self.next()
                if self.peek()[1] == "^":  # cm^2
                    self.next()
                    self.parse_atom()
            else:
                return

    def parse_relation(self) -> tuple:
        first = self.parse_value()
        ops: list[str] = []
        exprs = [first]
        while True:
            kind, value = self.peek()
            op = _REL_OPS.get(value) if kind == "op" else _REL_CMDS.get(value)
            if op is None:
                break
            self.next()
            ops.append(op)
            exprs.append(self.parse_value())
        return exprs[0] if not ops else ("rel", ops, exprs)

    def parse_value(self) -> tuple:
        """One side of a relation; `25\\%` is ("percent", 25): the mark applies to the whole
        value written before it, as answers use it (`-5\\%`, `\\frac{1}{2}\\%`)."""
        node = self.parse_setexpr()
        kind, value = self.peek()
        word = value if kind == "word" else _text_value(value) if kind == "text" else ""
        if word.lower() in PERCENT_WORDS:
            self.next()
            return ("percent", node)
        return node

    def parse_setexpr(self) -> tuple:
        parts = [self.parse_expr(0)]
        while self.peek()[1] in ("\\cup", "U") and self.peek()[0] in ("cmd", "word"):
            self.next()
            parts.append(self.parse_expr(0))
        return parts[0] if len(parts) == 1 else ("union", parts)

    # binding powers: additive 10, ratio 5, multiplicative 20, unary 30, power 40
    def parse_expr(self, min_bp: int) -> tuple:
        kind, value = self.peek()
        if value in ("-", "+") and kind == "op":
            self.next()
            operand = self.parse_expr(30)
            left = ("neg", operand) if value == "-" else operand
        elif value in ("\\pm", "\\mp"):
            self.next()
            left = ("pm", None, self.parse_expr(30))
        else:
            left = self.parse_postfix(self.parse_atom())
        while True:
            kind, value = self.peek()
            if value in ("+", "-") and kind == "op" and min_bp < 10:
                self.next()
                right = self.parse_expr(10)
                left = _add(left, right if value == "+" else ("neg", right))
            elif value in ("\\pm", "\\mp") and min_bp < 10:
                self.next()
                left = ("pm", left, self.parse_expr(10))
            elif value == ":" and min_bp < 5:
                self.next()
                right = self.parse_expr(5)
                left = ("ratio", [*left[1], right] if left[0] == "ratio" else [left, right])
            elif (value in ("*", "/") and kind == "op") or value in (
                "\\cdot",
                "\\times",
                "\\div",
                "\\ast",
            ):
                if min_bp >= 20:
                    break
                self.next()
                right = self.parse_expr(20)
                left = ("div", left, right) if value in ("/", "\\div") else _mul(left, right)
            elif self.starts_atom() and min_bp < 20:
                # Juxtaposition: 2x, 3\sqrt{2}, (x+1)(x-1); binds like explicit multiplication.
                mixed = self.peek()[1] == "\\frac" and _is_integer(left)
                right = self.parse_expr(20)
                if mixed and right[0] == "div" and right[1][0] == right[2][0] == "num":
                    # 918\frac{1}{2} is the mixed number 918 + 1/2.
                    left = ("add", [left, ("neg", right) if left[0] == "neg" else right])
                else:
                    left = _mul(left, right)
            else:
                break
        return left

    def starts_atom(self) -> bool:
        kind, value = self.peek()
        if kind in ("num", "base"):
            return True
        if kind == "word":
            return value.lower() not in ("and", "or") and value.lower() not in UNIT_WORDS
        if kind == "cmd":
            return value not in _REL_CMDS and value not in (
                "\\cup", "\\pm", "\\mp", "\\cdot", "\\times", "\\div", "\\ast", "\\end",
                "\\}", "\\rbrace", "\\rangle", "\\\\",
            )  # fmt: skip
        return value in ("(", "[", "{") or (value == "|" and False)

    def parse_postfix(self, node: tuple) -> tuple:
        while True:
            value = self.peek()[1]
            if value == "^":
                self.next()
                if self.peek()[1] in ("-", "+"):
                    sign = self.next()[1]
                    exp = self.parse_postfix(self.parse_atom())
                    exp = ("neg", exp) if sign == "-" else exp
                else:
                    exp = self.parse_postfix_noexp(self.parse_atom())
                node = ("pow", node, exp)
            elif value == "!":
                self.next()
                node = ("fact", node)
            elif value == "'" and node[0] == "sym":
                self.next()
                node = ("sym", node[1] + "'")
            else:
                return node

    def parse_postfix_noexp(self, node: tuple) -> tuple:
        # a^b^c is a^(b^c): the exponent's own power binds first.
        if self.peek()[1] == "^":
            self.next()
            exp = self.parse_postfix_noexp(self.parse_atom())
            return ("pow", node, exp)
        return node

    def parse_group(self, open_: str, close: str) -> tuple:
        self.expect(open_)
        node = self.parse_top_inside(close)
        self.expect(close)
        return node

    def parse_top_inside(self, close: str) -> tuple:
        items = self.parse_list(end=(close,))
        return items[0] if len(items) == 1 else ("list", items)

    def parse_arg(self) -> tuple:
        """A LaTeX macro argument: a braced group or a single token (\\frac12, \\sqrt3)."""
        kind, value = self.peek()
        if value == "{":
            return self.parse_group("{", "}")
        if kind == "num":
            self.next()
            # \frac12: a bare argument is one digit; the rest of the number is the next one.
            digits = value.replace(",", "")
            if len(digits) > 1 and digits.isdigit():
                self.toks[self.i - 1 : self.i] = [("num", digits[0]), ("num", digits[1:])]
                return ("num", Fraction(digits[0]))
            return ("num", parse_number(value))
        if kind == "word":
            self.next()
            if len(value) > 1:
                self.toks[self.i - 1 : self.i] = [("word", value[0]), ("word", value[1:])]
            return ("sym", value[0])
        return self.parse_atom()

    def parse_atom(self) -> tuple:
        kind, value = self.next()
        if kind == "num":
            return ("num", parse_number(value))
        if kind == "word":
            low = value.lower()
            if low in FUNCTIONS:
                return self.parse_function(low)
            if low in ("infty", "inf", "infinity"):
                return ("sym", "oo")
            if low == "pi":
                return ("sym", "pi")
            if len(value) == 1:
                return self.parse_subscript(("sym", value))
            # xy is x*y: split letter runs into single-letter symbols.
            syms = [("sym", c) for c in value]
            last = self.parse_subscript(syms[-1])
            return ("mul", [*syms[:-1], last])
        if kind == "base":
            return ("text", value)
        if kind == "text":
            content = _text_value(value)
            if not content:
                return self.parse_atom()
            inner = content.split()
            if len(inner) == 1 and inner[0].isalpha() and len(inner[0]) == 1:
                return ("sym", inner[0])
            return ("text", content.lower())
        if kind == "cmd":
            return self.parse_command(value)
        if value == "(":
            return self.parse_bracketed("(")
        if value == "[":
            return self.parse_bracketed("[")
        if value == "{":
            node = self.parse_top_inside("}")
            self.expect("}")
            # {1,2,3} written without \{ is still a set in answers.
            return ("set", node[1]) if node[0] == "list" else node
        if value == "|":
            inner = self.parse_expr(0)
            self.expect("|")
            return ("func", "abs", [inner])
        raise ParseError(f"unexpected {value or 'end of input'!r}")

    def parse_bracketed(self, open_: str) -> tuple:
        node = self.parse_top_inside(")]")
        close = self.next()[1]
        if close not in (")", "]"):
            raise ParseError("unbalanced brackets")
        items = node[1] if node[0] == "list" else [node]
        if len(items) == 2 and (open_ != "(" or close != ")"):
            return ("interval", items[0], items[1], open_ == "[", close == "]")
        if len(items) == 1:
            if open_ == "[" and close == "]":
                return items[0]
            if open_ != "(" or close != ")":
                raise ParseError("mismatched brackets")
            return items[0]
        return ("tuple", items)

    def parse_subscript(self, node: tuple) -> tuple:
        if self.peek()[1] != "_":
            return node
        self.next()
        kind, value = self.peek()
        if value == "{":
            start = self.i
            self.parse_group("{", "}")
            sub = "".join(v for _, v in self.toks[start + 1 : self.i - 1])
        else:
            self.next()
            sub = value
        return ("sym", f"{node[1]}_{sub}")

    def parse_function(self, name: str) -> tuple:
        power = None
        if self.peek()[1] == "^":  # \sin^2 x
            self.next()
            power = self.parse_atom()
        if self.peek()[1] == "(":
            self.next()
            inner = self.parse_top_inside(")")
            self.expect(")")
            args = inner[1] if inner[0] == "list" else [inner]
        elif self.peek()[1] == "{":
            args = [self.parse_group("{", "}")]
        else:
            # \sin 2x: the argument runs to the next operator or function.
            args = [self.parse_postfix(self.parse_atom())]
            while self.starts_atom() and not self.starts_function():
                args[0] = _mul(args[0], self.parse_postfix(self.parse_atom()))
        node = ("func", name, args)
        return ("pow", node, power) if power is not None else node

    def starts_function(self) -> bool:
        kind, value = self.peek()
        name = value[1:] if kind == "cmd" else value.lower()
        return name in FUNCTIONS or name in ("frac", "sqrt")

    def parse_command(self, cmd: str) -> tuple:
        name = cmd[1:]
        if name == "frac":
            num = self.parse_arg()
            den = self.parse_arg()
            return ("div", num, den)
        if name == "binom":
            return ("func", "binomial", [self.parse_arg(), self.parse_arg()])
        if name == "sqrt":
            if self.peek()[1] == "[":
                self.next()
                index = self.parse_top_inside("]")
                self.expect("]")
                return ("func", "root", [self.parse_arg(), index])
            return ("func", "sqrt", [self.parse_arg()])
        if name in FUNCTIONS:
            return self.parse_function(name)
        if name in ("infty", "infin"):
            return ("sym", "oo")
        if name == "pi":
            return ("sym", "pi")
        if name in GREEK:
            return self.parse_subscript(("sym", name))
        if name in ("{", "lbrace"):
            node = self.parse_top_inside("\\}" if name == "{" else "\\rbrace")
            self.next()
            return ("set", node[1] if node[0] == "list" else [node])
        if name == "langle":
            node = self.parse_top_inside("\\rangle")
            self.expect("\\rangle")
            return ("tuple", node[1] if node[0] == "list" else [node])
        if name == "emptyset" or name == "varnothing":
            return ("set", [])
        if name == "begin":
            return self.parse_environment()
        if name in ("overline", "vec", "mathbf", "hat", "bar", "widehat", "overrightarrow"):
            inner = self.parse_arg()
            return inner
        if name == "|":
            inner = self.parse_expr(0)
            self.expect("\\|")
            return ("func", "abs", [inner])
        if name in ("lfloor", "lceil"):
            inner = self.parse_expr(0)
            self.next()
            return ("func", "floor" if name == "lfloor" else "ceiling", [inner])
        if name in ("sum", "prod"):
            return self.parse_big_operator(name)
        if name in ("int", "lim", "oint"):
            raise ParseError(f"unsupported command {cmd}")
        # Any other macro is a name (\zzz, \ell, \hbar): compared by name, never expanded.
        return self.parse_subscript(("sym", name))

    def parse_big_operator(self, name: str) -> tuple:
        """`\\sum_{k=lo}^{hi} body`; the body is one product term, as for `\\sin 2x`."""
        if self.peek()[1] != "_" or self.peek(1)[1] != "{":
            raise ParseError(f"\\{name} needs a range written _{{k=a}}^{{b}}")
        self.next()
        bound = self.parse_group("{", "}")
        if not (bound[0] == "rel" and bound[1] == ["="] and bound[2][0][0] == "sym"):
            raise ParseError(f"\\{name} needs a range written _{{k=a}}^{{b}}")
        if self.peek()[1] != "^":
            raise ParseError(f"\\{name} needs an upper limit")
        self.next()
        hi = self.parse_arg()
        body = self.parse_expr(15)
        return ("bigop", name, bound[2][0][1], bound[2][1], hi, body)

    def parse_environment(self) -> tuple:
        self.expect("{")
        env = self.next()[1]
        self.expect("}")
        if env not in (
            "pmatrix",
            "bmatrix",
            "matrix",
            "vmatrix",
            "Bmatrix",
            "array",
            "smallmatrix",
        ):
            raise ParseError(f"unsupported environment {env}")
        if env == "array" and self.peek()[1] == "{":  # column spec {cc}
            self.parse_group_raw()
        rows: list[list[tuple]] = [[]]
        while True:
            kind, value = self.peek()
            if value == "\\end":
                self.next()
                self.expect("{")
                self.next()
                self.expect("}")
                break
            if kind == "eof":
                raise ParseError("unterminated matrix")
            if value == "&":
                self.next()
                continue
            if value == "\\\\":
                self.next()
                rows.append([])
                continue
            rows[-1].append(self.parse_expr(0))
        rows = [r for r in rows if r]
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return ("matrix", rows)

    def parse_group_raw(self) -> None:
        depth = 0
        while True:
            value = self.next()[1]
            if value == "{":
                depth += 1
            elif value == "}":
                depth -= 1
                if depth == 0:
                    return
            elif value == "":
                raise ParseError("unbalanced braces")


def _add(a: tuple, b: tuple) -> tuple:
    return ("add", [*a[1], b]) if a[0] == "add" else ("add", [a, b])


def _mul(a: tuple, b: tuple) -> tuple:
    return ("mul", [*a[1], b]) if a[0] == "mul" else ("mul", [a, b])


def _is_integer(node: tuple) -> bool:
    if node[0] == "neg":
        node = node[1]
    return node[0] == "num" and node[1].denominator == 1
