"""Structural comparison of parsed answers, shared by the exact and the symbolic paths.

The structure rules (tuples ordered, sets and bare lists unordered, `x = 3` against `3`,
intervals against inequality chains) live here once; what differs between the in-process fast
path and the worker is only how two expression leaves are decided, which a subclass supplies.
"""

from __future__ import annotations

import math
from fractions import Fraction

from scorers.math._parse import LimitExceeded

MAX_EXPONENT = 10_000
MAX_RESULT_BITS = 200_000
MAX_FACTORIAL = 1_000
MAX_VARIANTS = 16

_STRUCT = {"tuple", "set", "list", "interval", "union", "rel", "ratio", "text"}
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


class NeedSymbolic(Exception):
    """The fast path cannot decide; the symbolic worker must."""


def has_kind(node: object, kinds: set[str]) -> bool:
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, tuple) and cur and isinstance(cur[0], str):
            if cur[0] in kinds:
                return True
            stack.extend(cur[1:])
        elif isinstance(cur, list):
            stack.extend(cur)
    return False


def is_name(node: tuple) -> bool:
    """A left-hand side that names the answer (x, f(x), (p,q), |AB|, V_1:V_2), not a value."""
    return node[0] not in ("rel", "text", "num", "percent") and not has_kind(
        node, {"num", "rel", "text", "percent"}
    )


def reduce_relation(node: tuple) -> tuple:
    """`x = 5+5+1 = 11` -> `x = 11`; `1 = y = 0` -> `0`; `x = 1/3 ≈ 0.33` -> `x = 1/3`."""
    if node[0] != "rel":
        return node
    ops, exprs = list(node[1]), list(node[2])
    if not set(ops) <= {"=", "~"}:
        return node
    if "~" in ops:
        k = ops.index("~")
        if k >= 1:  # an exact value was written before the approximation: it is the answer
            ops, exprs = ops[:k], exprs[: k + 1]
        elif is_name(exprs[0]):  # x ≈ 11: the approximation is the only value given
            exprs = [exprs[0], exprs[-1]]
            ops = ["="]
        else:  # √3/3 ≈ 0.577: the exact value comes first
            return exprs[0]
    if len(exprs) >= 3:
        exprs = [exprs[0], exprs[-1]] if is_name(exprs[0]) else [exprs[-1]]
    if len(exprs) == 2 and is_constant(exprs[0]) and is_constant(exprs[1]):
        # `\frac12 \cdot \frac{20}{9} = \frac{10}{9}`: a computation shown, then its result.
        # Only between constants: `0 = x^2 - 1` stays an equation.
        return exprs[1]
    if len(exprs) == 1:
        return exprs[0]
    return ("rel", ["="], exprs)


_ARITHMETIC = {"num", "add", "mul", "neg", "div", "pow", "fact", "func", "percent"}


def is_constant(node: tuple) -> bool:
    """Arithmetic on numbers (and pi) only: no variables, text, relations or structures."""
    stack = [node]
    while stack:
        cur = stack.pop()
        kind = cur[0]
        if kind == "sym":
            if cur[1] != "pi":
                return False
        elif kind not in _ARITHMETIC:
            return False
        elif kind == "func":
            stack.extend(cur[2])
        elif kind in ("add", "mul"):
            stack.extend(cur[1])
        elif kind != "num":
            stack.extend(c for c in cur[1:] if isinstance(c, tuple))
    return True


def as_set(node: tuple) -> tuple | None:
    """A condition on one variable (`x > 2`, `1 <= |z| < 3`, `x \\in S`) as the set of the
    variable's values: an interval or a union of intervals. None when it is not one."""
    if node[0] != "rel":
        return None
    ops, exprs = node[1], node[2]
    if ops == ["in"] and len(exprs) == 2:
        # Only a plain name: `x^2 \\in [1, 4]` is not the statement `x \\in [1, 4]`.
        return exprs[1] if _is_variable(exprs[0]) and exprs[0][0] != "func" else None
    oo = ("sym", "oo")
    if len(ops) == 1 and ops[0] in _FLIP:
        op, lhs, rhs = ops[0], exprs[0], exprs[1]
        if not _is_variable(lhs):
            lhs, rhs, op = rhs, lhs, _FLIP[op]
            if not _is_variable(lhs):
                return None
        if op in ("<", "<="):
            lo, hi, lo_closed, hi_closed = ("neg", oo), rhs, False, op == "<="
        else:
            lo, hi, lo_closed, hi_closed = rhs, oo, op == ">=", False
    elif len(ops) == 2 and _is_variable(exprs[1]) and not _mentions(exprs[0::2], exprs[1]):
        # A two-sided chain is a condition on its middle name whatever the bounds are
        # (-pi < t <= sqrt 5, a < x < b), as long as they do not involve that name.
        lhs = exprs[1]
        if set(ops) <= {"<", "<="}:
            lo, hi, lo_closed, hi_closed = exprs[0], exprs[2], ops[0] == "<=", ops[1] == "<="
        elif set(ops) <= {">", ">="}:
            lo, hi, lo_closed, hi_closed = exprs[2], exprs[0], ops[1] == ">=", ops[0] == ">="
        else:
            return None
    else:
        return None
    if lhs[0] == "func":  # |x| within [lo, hi]: x in [-hi, -lo] U [lo, hi]
        return _abs_range(lo, hi, lo_closed, hi_closed)
    return ("interval", lo, hi, lo_closed, hi_closed)


def _is_variable(node: tuple) -> bool:
    """A plain name (x, x_1, f(x) -- juxtaposed names), or its absolute value |x|.

    Not -x, x+y, x^y, x/y or sin x: for those the set of x differs from the written bound.
    """
    if node[0] == "func" and node[1] == "abs" and len(node[2]) == 1:
        node = node[2][0]
    if node[0] == "mul":
        return all(_is_variable(f) and f[0] != "func" for f in node[1])
    return node[0] == "sym" and node[1] not in ("oo", "pi")


def _mentions(nodes: list[tuple], name: tuple) -> bool:
    """Whether any of `nodes` uses a symbol of `name` (a plain name, see _is_variable)."""
    names = {n[1] for n in _symbols(name)}
    return any(s[1] in names for node in nodes for s in _symbols(node))


def _symbols(node: object) -> list[tuple]:
    out = []
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, tuple) and cur and isinstance(cur[0], str):
            if cur[0] == "sym":
                out.append(cur)
            else:
                stack.extend(cur[1:])
        elif isinstance(cur, list):
            stack.extend(cur)
    return out


def _abs_range(lo: tuple, hi: tuple, lo_closed: bool, hi_closed: bool) -> tuple | None:
    """The x with lo (<|<=) |x| (<|<=) hi, for exact rational or infinite bounds; else None."""
    oo = ("sym", "oo")
    neg_oo = ("neg", oo)
    lo_v = None if lo == neg_oo else _rational(lo)
    hi_v = None if hi == oo else _rational(hi)
    if (lo != neg_oo and lo_v is None) or (hi != oo and hi_v is None):
        return None  # symbolic bounds: their sign is unknown here
    if lo_v is not None and lo_v < 0:
        lo, lo_v, lo_closed = neg_oo, None, False  # |x| > -1 says nothing
    if hi_v is not None and (hi_v < 0 or (hi_v == 0 and not hi_closed)):
        return None  # empty
    if lo_v is not None and hi_v is not None and lo_v >= hi_v:
        return None  # empty or single points: not written as a range in practice
    if lo_v is None or (lo_v == 0 and lo_closed):
        # No lower bound in effect: one interval symmetric about 0.
        if hi_v is None:
            return None  # all reals, written as a condition: not compared
        return ("interval", ("neg", hi), hi, hi_closed, hi_closed)
    upper_outer = neg_oo if hi_v is None else ("neg", hi)
    right = ("interval", lo, oo if hi_v is None else hi, lo_closed, hi_closed and hi_v is not None)
    left = ("interval", upper_outer, ("neg", lo), hi_closed and hi_v is not None, lo_closed)
    return ("union", [left, right])


def _rational(node: tuple) -> Fraction | None:
    try:
        return exact_value(node)
    except (NeedSymbolic, LimitExceeded, ZeroDivisionError):
        return None


def expand_pm(node: object) -> list:
    """All sign choices of every ± in an expression (1 ± √5 -> [1 + √5, 1 - √5])."""
    if isinstance(node, list):
        out: list[list] = [[]]
        for item in node:
            variants = expand_pm(item)
            out = [prev + [v] for prev in out for v in variants]
            if len(out) > MAX_VARIANTS:
                raise LimitExceeded("too many ± combinations")
        return out
    if not (isinstance(node, tuple) and node and isinstance(node[0], str)):
        return [node]
    if node[0] == "pm":
        a, b = node[1], node[2]
        out_nodes = []
        for bv in expand_pm(b):
            if a is None:
                out_nodes += [bv, ("neg", bv)]
            else:
                for av in expand_pm(a):
                    out_nodes += [("add", [av, bv]), ("add", [av, ("neg", bv)])]
        return out_nodes
    if not has_kind(node, {"pm"}):
        return [node]
    results: list[tuple] = [()]
    for part in node[1:]:
        variants = expand_pm(part)
        results = [prev + (v,) for prev in results for v in variants]
        if len(results) > MAX_VARIANTS:
            raise LimitExceeded("too many ± combinations")
    return [(node[0], *r) for r in results]


class Comparator:
    """Decides whether two parsed answers denote the same object. Subclasses decide leaves."""

    def equal(self, a: tuple, b: tuple) -> bool:
        if a == b:
            return True
        a, b = reduce_relation(a), reduce_relation(b)
        ka, kb = a[0], b[0]
        if ka == "rel" or kb == "rel":
            return self._relation_vs(a, b)
        if ka == "percent" or kb == "percent":
            return self._percent(a, b)
        if ka == "union" or kb == "union":
            pa = a[1] if ka == "union" else [a]
            pb = b[1] if kb == "union" else [b]
            return self._same_set(pa, pb)
        if ka in ("list", "set") and kb in ("list", "set"):
            return self._same_set(a[1], b[1])
        if ka == "tuple" and kb in ("tuple", "list", "set"):
            return self._same_seq(a[1], b[1])
        if kb == "tuple" and ka in ("list", "set"):
            return self._same_seq(a[1], b[1])
        if ka == "interval" or kb == "interval":
            return self._interval(a, b)
        if ka == "ratio" and kb == "ratio":
            return self._same_seq(a[1], b[1])
        if ka == "text" or kb == "text":
            return self._text(a, b)
        if ka in _STRUCT or kb in _STRUCT:
            if has_kind(a, {"pm"}) or has_kind(b, {"pm"}):
                return self._pm(a, b)
            return False
        if has_kind(a, {"pm"}) or has_kind(b, {"pm"}):
            return self._pm(a, b)
        return self.leaf_equal(a, b)

    def _percent(self, a: tuple, b: tuple) -> bool:
        """A value written with % equals that number and that number / 100, nothing else:
        25% = 25 = 1/4, but 0.25 != 25 (no % written) and 25% != 0.25% (both written)."""
        if a[0] == "percent" and b[0] == "percent":
            return self.equal(a[1], b[1])
        pct, other = (a, b) if a[0] == "percent" else (b, a)
        return self.equal(pct[1], other) or self.equal(
            ("div", pct[1], ("num", Fraction(100))), other
        )

    def _pm(self, a: tuple, b: tuple) -> bool:
        va = expand_pm(a) if a[0] not in ("list", "set") else a[1]
        vb = expand_pm(b) if b[0] not in ("list", "set") else b[1]
        va = [x for v in va for x in expand_pm(v)]
        vb = [x for v in vb for x in expand_pm(v)]
        if len(va) == 1 and len(vb) == 1:
            return self.leaf_equal(va[0], vb[0])
        if len(va) == 1 or len(vb) == 1:
            return False
        return self._same_set(va, vb)

    def _same_seq(self, xs: list, ys: list) -> bool:
        return len(xs) == len(ys) and all(self.equal(x, y) for x, y in zip(xs, ys, strict=True))

    def _same_set(self, xs: list, ys: list) -> bool:
        # Set semantics: duplicates do not count, every element needs a partner on the other side.
        return all(any(self.equal(x, y) for y in ys) for x in xs) and all(
            any(self.equal(x, y) for x in xs) for y in ys
        )

    def _interval(self, a: tuple, b: tuple) -> bool:
        # An open pair "(a, b)" is read as the open interval when compared with an interval.
        def norm(n: tuple) -> tuple | None:
            if n[0] == "interval":
                return n
            if n[0] == "tuple" and len(n[1]) == 2:
                return ("interval", n[1][0], n[1][1], False, False)
            return None

        na, nb = norm(a), norm(b)
        if na is None or nb is None:
            return False
        return (
            na[3] == nb[3]
            and na[4] == nb[4]
            and self.equal(na[1], nb[1])
            and self.equal(na[2], nb[2])
        )

    def _text(self, a: tuple, b: tuple) -> bool:
        def words(n: tuple) -> str | None:
            if n[0] == "text":
                return n[1]
            if n[0] == "sym":
                return n[1].lower()
            return None

        wa, wb = words(a), words(b)
        return wa is not None and wa == wb

    def _relation_vs(self, a: tuple, b: tuple) -> bool:
        if a[0] == "rel" and b[0] == "rel":
            if _same_name_equation(a, b) and self.equal(a[2][1], b[2][1]):
                return True  # x = A against x = B with A = B (25% against 1/4, say)
            if self._relations_equal(a, b):
                return True
            sa, sb = as_set(a), as_set(b)
            if sa is not None and sb is not None:
                return self.equal(sa, sb)
            # x = 3 against y = 3 with different names: the named values are the answers.
            if a[1] == ["="] and b[1] == ["="] and is_name(a[2][0]) and is_name(b[2][0]):
                return False
            return False
        rel, other = (a, b) if a[0] == "rel" else (b, a)
        if rel[1] == ["="] and is_name(rel[2][0]):
            return self.equal(rel[2][1], other)
        as_interval = as_set(rel)
        if as_interval is not None and other[0] in ("interval", "union", "tuple", "set"):
            return self.equal(as_interval, other)
        return False

    def _relations_equal(self, a: tuple, b: tuple) -> bool:
        ra, rb = _normal_relations(a), _normal_relations(b)
        if ra is None or rb is None or len(ra) != len(rb):
            return False
        for (opa, ea), (opb, eb) in zip(ra, rb, strict=True):
            if opa != opb:
                return False
            sign = self.ratio_sign(ea, eb)
            if sign is None:
                return False
            if opa in ("<", "<=") and sign < 0:
                return False
        return True

    # -- leaves (subclasses) -------------------------------------------------------------
    def leaf_equal(self, a: tuple, b: tuple) -> bool:
        raise NotImplementedError

    def ratio_sign(self, a: tuple, b: tuple) -> int | None:
        """Sign of the constant a/b, or None when a/b is not a nonzero constant."""
        raise NotImplementedError


def _same_name_equation(a: tuple, b: tuple) -> bool:
    return (
        a[1] == b[1] == ["="]
        and len(a[2]) == len(b[2]) == 2
        and a[2][0] == b[2][0]
        and is_name(a[2][0])
    )


def _normal_relations(node: tuple) -> list[tuple[str, tuple]] | None:
    """A relation chain as [(op, lhs - rhs)] with ops in = != < <=."""
    ops, exprs = node[1], node[2]
    out = []
    for op, lhs, rhs in zip(ops, exprs, exprs[1:], strict=False):
        if op in (">", ">="):
            op, lhs, rhs = _FLIP[op], rhs, lhs
        if op not in ("=", "!=", "<", "<="):
            return None
        out.append((op, ("add", [lhs, ("neg", rhs)])))
    return out


class ExactComparator(Comparator):
    """In-process, sympy-free: decides leaves that are rational numbers, defers the rest."""

    def leaf_equal(self, a: tuple, b: tuple) -> bool:
        if a[0] == "matrix" and b[0] == "matrix":
            ra, rb = a[1], b[1]
            if len(ra) != len(rb) or len(ra[0]) != len(rb[0]):
                return False
            return all(
                self.leaf_equal(x, y)
                for row_a, row_b in zip(ra, rb, strict=True)
                for x, y in zip(row_a, row_b, strict=True)
            )
        return exact_value(a) == exact_value(b)

    def ratio_sign(self, a: tuple, b: tuple) -> int | None:
        raise NeedSymbolic


def exact_value(node: tuple) -> Fraction:
    """Evaluate a tree of rational arithmetic exactly; NeedSymbolic for anything else."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "add":
        return sum((exact_value(t) for t in node[1]), Fraction(0))
    if kind == "mul":
        out = Fraction(1)
        for f in node[1]:
            out *= exact_value(f)
        return out
    if kind == "neg":
        return -exact_value(node[1])
    if kind == "percent":  # inside arithmetic, % is / 100
        return exact_value(node[1]) / 100
    if kind == "div":
        den = exact_value(node[2])
        if den == 0:
            raise NeedSymbolic
        return exact_value(node[1]) / den
    if kind == "pow":
        return _exact_pow(exact_value(node[1]), exact_value(node[2]))
    if kind == "fact":
        v = exact_value(node[1])
        if v.denominator != 1 or v < 0:
            raise NeedSymbolic
        if v > MAX_FACTORIAL:
            raise LimitExceeded(f"factorial argument above {MAX_FACTORIAL}")
        return Fraction(math.factorial(int(v)))
    if kind == "func" and node[1] == "sqrt" and len(node[2]) == 1:
        v = exact_value(node[2][0])
        if v >= 0:
            rn, rd = math.isqrt(v.numerator), math.isqrt(v.denominator)
            if rn * rn == v.numerator and rd * rd == v.denominator:
                return Fraction(rn, rd)
    raise NeedSymbolic


def _exact_pow(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        raise NeedSymbolic
    e = exp.numerator
    if base in (0, 1):
        if base == 0 and e < 0:
            raise NeedSymbolic
        return base
    if base == -1:
        return Fraction(-1 if e % 2 else 1)
    if abs(e) > MAX_EXPONENT:
        raise LimitExceeded(f"exponent above {MAX_EXPONENT}")
    bits = (base.numerator.bit_length() + base.denominator.bit_length()) * abs(e)
    if bits > MAX_RESULT_BITS:
        raise LimitExceeded("power too large")
    return base**e
