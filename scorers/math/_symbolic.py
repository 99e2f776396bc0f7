"""The symbolic path: parsed trees to sympy objects, compared in a killable worker process.

Trees come from scorers.math._parse, never from raw text, so sympy's string parsers (which call
eval) are never involved. Constructors get only numbers, names we choose and other sympy
objects. Power and factorial sizes are checked before building, and the caller runs this module
in a worker process it kills on timeout, because sympy's simplification has no time bound.
"""

from __future__ import annotations

import random
from fractions import Fraction

import sympy
from sympy import Rational, Symbol

from scorers.math._compare import (
    MAX_EXPONENT,
    MAX_FACTORIAL,
    Comparator,
    ExactComparator,
    NeedSymbolic,
)
from scorers.math._parse import LimitExceeded

_CONST = {"pi": sympy.pi, "oo": sympy.oo, "e": sympy.E, "i": sympy.I}
_FUNCS = {
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "sec": sympy.sec,
    "csc": sympy.csc,
    "cot": sympy.cot,
    "arcsin": sympy.asin,
    "arccos": sympy.acos,
    "arctan": sympy.atan,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
    "ln": sympy.log,
    "log": sympy.log,
    "exp": sympy.exp,
    "abs": sympy.Abs,
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
}


_BIG_OPS = {"sum": sympy.Function("Σ"), "prod": sympy.Function("Π")}


def to_sympy(node: tuple, bound: frozenset[str] = frozenset()) -> sympy.Basic:
    """The sympy object for a parsed tree. `bound`: names bound by an enclosing \\sum/\\prod,
    which are variables even when spelled like a constant (the index i is not sqrt(-1))."""
    kind = node[0]
    if kind == "num":
        return Rational(node[1].numerator, node[1].denominator)
    if kind == "sym":
        name = node[1]
        return Symbol(name) if name in bound else (_CONST.get(name) or Symbol(name))
    if kind == "add":
        return sympy.Add(*[to_sympy(t, bound) for t in node[1]])
    if kind == "mul":
        return sympy.Mul(*[to_sympy(t, bound) for t in node[1]])
    if kind == "neg":
        return -to_sympy(node[1], bound)
    if kind == "div":
        return to_sympy(node[1], bound) / to_sympy(node[2], bound)
    if kind == "percent":
        return to_sympy(node[1], bound) / 100
    if kind == "pow":
        base, exp = to_sympy(node[1], bound), to_sympy(node[2], bound)
        if exp.is_Number and abs(exp) > MAX_EXPONENT and base not in (0, 1, -1):
            raise LimitExceeded(f"exponent above {MAX_EXPONENT}")
        if exp.is_number and not exp.is_Number:
            # A symbolic-constant exponent like 10^(10^10) stays unevaluated until checked.
            approx = exp.evalf(15)
            if approx.is_Number and abs(approx) > MAX_EXPONENT:
                raise LimitExceeded(f"exponent above {MAX_EXPONENT}")
        return sympy.Pow(base, exp)
    if kind == "fact":
        arg = to_sympy(node[1], bound)
        if arg.is_Number and arg > MAX_FACTORIAL:
            raise LimitExceeded(f"factorial argument above {MAX_FACTORIAL}")
        return sympy.factorial(arg)
    if kind == "func":
        name, args = node[1], [to_sympy(a, bound) for a in node[2]]
        if name == "sqrt" and len(args) == 1:
            return sympy.sqrt(args[0])
        if name == "root" and len(args) == 2:
            return sympy.root(args[0], args[1])
        if name == "binomial" and len(args) == 2:
            return sympy.binomial(args[0], args[1])
        if name in _FUNCS and len(args) == 1:
            return _FUNCS[name](args[0])
        if name == "log" and len(args) == 2:
            return sympy.log(args[0], args[1])
        raise NeedSymbolic
    if kind == "bigop":
        # Compared as written, never evaluated: an opaque application of Σ/Π to (index, lo,
        # hi, body). Equal arguments give equal sums, so this can only miss an equality, never
        # invent one. Evaluating would be unsound here: subscripted names like F_k are opaque
        # symbols that do not depend on k.
        _, name, var, lo, hi, body = node
        inner = bound | {var}
        return _BIG_OPS[name](Symbol(var), to_sympy(lo, bound), to_sympy(hi, bound),
                              to_sympy(body, inner))  # fmt: skip
    if kind == "matrix":
        return sympy.ImmutableMatrix([[to_sympy(x, bound) for x in row] for row in node[1]])
    raise NeedSymbolic


def _is_zero(d: sympy.Basic) -> bool:
    if d == 0:
        return True
    free = sorted(d.free_symbols, key=str)
    # Cheap refutation first: a random rational point where the difference is clearly nonzero.
    rng = random.Random(0)
    for _ in range(3):
        point = {s: Rational(rng.randint(2, 97), rng.randint(2, 13)) for s in free}
        try:
            val = sympy.N(d.subs(point), 30)
        except (TypeError, ValueError, ZeroDivisionError):
            break
        if val.is_Number and val.is_finite and abs(val) > sympy.Float("1e-20", 30):
            return False
        if not free:
            break
    for simplifier in (sympy.expand, sympy.radsimp, sympy.simplify):
        if simplifier(d) == 0:
            return True
    return d.equals(0) is True


def _is_rational_function(e: sympy.Basic) -> bool:
    """Sums, products and integer powers of symbols and rational numbers only.

    Radicals are excluded on purpose, and sqrt(2) = Pow(2, 1/2) is built from rationals alone:
    cancel would treat it as an independent generator and miss identities that need
    sqrt(2)**2 = 2, so (sqrt(2) x + 2) / (x + sqrt(2)) = sqrt(2) would look non-constant.
    """
    if e.is_Symbol or e.is_Rational:
        return True
    if e.is_Pow:
        return e.exp.is_Integer and _is_rational_function(e.base)
    if e.is_Add or e.is_Mul:
        return all(_is_rational_function(a) for a in e.args)
    return False


class SympyComparator(Comparator):
    """Decides leaves with sympy: exact first, then zero-testing of the difference."""

    def __init__(self) -> None:
        self.exact = ExactComparator()

    def leaf_equal(self, a: tuple, b: tuple) -> bool:
        try:
            return self.exact.leaf_equal(a, b)
        except NeedSymbolic:
            pass
        try:
            sa, sb = to_sympy(a), to_sympy(b)
        except NeedSymbolic:
            return False
        if isinstance(sa, sympy.MatrixBase) or isinstance(sb, sympy.MatrixBase):
            if not (isinstance(sa, sympy.MatrixBase) and isinstance(sb, sympy.MatrixBase)):
                return False
            if sa.shape != sb.shape:
                return False
            return all(_is_zero(x - y) for x, y in zip(sa, sb, strict=True))
        if sa == sb:
            return True
        if sa.has(sympy.oo, -sympy.oo, sympy.zoo) or sb.has(sympy.oo, -sympy.oo, sympy.zoo):
            return False
        return _is_zero(sa - sb)

    def ratio_sign(self, a: tuple, b: tuple) -> int | None:
        try:
            sa, sb = to_sympy(a), to_sympy(b)
        except NeedSymbolic:
            return None
        if sb == 0 or sa == 0:
            return 1 if sa == sb else None
        if _is_rational_function(sa) and _is_rational_function(sb):
            # Exact and cheap: over Q, cancel returns p'/q' in lowest terms. If the ratio were a
            # constant c, then p' = c q', so gcd(p', q') = q' and cancel would have returned c;
            # symbols left over therefore prove it is not a constant, which simplify would
            # otherwise spend far longer failing to disprove (y = x + 2 against y = 2x + 1).
            ratio = sympy.cancel(sa / sb)
        else:
            ratio = sympy.simplify(sa / sb)
            if ratio.free_symbols:
                # simplify does not rationalize a denominator, so it misses
                # (sqrt(2) x + 2) / (x + sqrt(2)) = sqrt(2); radsimp multiplies by the conjugate.
                ratio = sympy.radsimp(ratio)
        if ratio.free_symbols or not ratio.is_number or ratio == 0:
            return None
        if ratio.is_positive:
            return 1
        if ratio.is_negative:
            return -1
        return None


def compare_symbolic(candidate: tuple, reference: tuple) -> bool:
    """Entry point run inside the worker process."""
    return SympyComparator().equal(candidate, reference)


def _prime() -> None:
    """Exercise the code paths sympy loads lazily (simplify, trig, relations, matrices).

    Run at import, which happens once in the workers' zygote (scorers.workers.zygote): every
    worker forked from it starts with these loaded, instead of paying for them on its first
    comparison.
    """
    x = Symbol("x")
    for a, b in (
        (("pow", ("add", [("sym", "x"), ("num", 1)]), ("num", 2)), ("num", 1)),
        (("add", [("pow", ("func", "sin", [("sym", "x")]), ("num", 2)),
                  ("pow", ("func", "cos", [("sym", "x")]), ("num", 2))]), ("num", 1)),
        (("func", "sqrt", [("num", 12)]), ("mul", [("num", 2), ("func", "sqrt", [("num", 3)])])),
        (("rel", ["<"], [("sym", "x"), ("num", 3)]), ("rel", ["<"], [("num", 3), ("sym", "x")])),
        (("matrix", [[("sym", "x")]]), ("matrix", [[("num", 1)]])),
    ):  # fmt: skip
        compare_symbolic(_frac(a), _frac(b))
    sympy.simplify(sympy.log(x) - sympy.exp(x) / sympy.tan(x))


def _frac(node: object) -> object:
    """Literal ints in the priming trees above as the Fractions the parser produces."""
    if isinstance(node, tuple):
        if node[0] == "num":
            return ("num", Fraction(node[1]))
        return tuple(_frac(n) for n in node)
    if isinstance(node, list):
        return [_frac(n) for n in node]
    return node


_prime()
