"""A pre-filter for CEL device selectors: the subset the controller can evaluate in Python.

The scheduler evaluates selectors exactly; the controller only needs to know
which GPUs a gang *could* get, so that placement (and a refusal's reason) is
computed over the right devices. Supported: ``device.driver`` and
``device.attributes["<domain>"].<name>`` (or ``["<name>"]``) compared with
``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` or ``in [..]`` against string, int
and bool literals, combined with ``&&``, ``||``, ``!`` and parentheses.

Anything else parses to :data:`UNKNOWN`, which matches every device: the
pre-filter may then offer too much, never too little, and the scheduler still
enforces the real selector. :func:`compile_all` reports which selectors were
not understood so the controller can say so in an Event.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuplane.controller.deviceclass import ClassView

AttrValue = str | int | bool
Attributes = Mapping[str, AttrValue]  # qualified name ("gpu.gpuplane.dev/type") -> value
Predicate = Callable[[str, Attributes], bool]  # (driver, attributes) -> matches

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<num>-?\d+)
      | (?P<op>&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|\[|\]|,|\.)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


class _Unsupported(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Unsupported(text[pos:])
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


MAX_EXPRESSION = 4096  # characters; longer selectors are not pre-filtered (the scheduler still enforces them)
MAX_NESTING = 32  # parentheses and negations; deeper ones are not pre-filtered either


@dataclass
class _Parser:
    toks: list[tuple[str, str]]
    i: int = 0
    depth: int = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise _Unsupported("unexpected end")
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise _Unsupported(f"expected {want}, got {tok[1]}")
        self.i += 1
        return tok

    def expr(self) -> Predicate:
        terms = [self.conj()]
        while self.peek() == "||":
            self.take()
            terms.append(self.conj())
        return terms[0] if len(terms) == 1 else _any(terms)  # flat: a long chain cannot nest closures

    def conj(self) -> Predicate:
        terms = [self.unary()]
        while self.peek() == "&&":
            self.take()
            terms.append(self.unary())
        return terms[0] if len(terms) == 1 else _all(terms)

    def _nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Unsupported(f"nested more than {MAX_NESTING} levels")

    def unary(self) -> Predicate:
        if self.peek() == "!":
            self.take()
            self._nest()
            inner = self.unary()
            self.depth -= 1
            return lambda d, a: not inner(d, a)
        if self.peek() == "(":
            self.take("(")
            self._nest()
            inner = self.expr()
            self.depth -= 1
            self.take(")")
            return inner
        return self.comparison()

    def operand(self) -> Callable[[str, Attributes], AttrValue | None] | AttrValue | list[AttrValue]:
        kind, text = self.take()
        if kind == "str":
            return _unquote(text)
        if kind == "num":
            return int(text)
        if kind == "ident" and text in ("true", "false"):
            return text == "true"
        if text == "[":
            items: list[AttrValue] = []
            while self.peek() != "]":
                value = self.operand()
                if callable(value) or isinstance(value, list):
                    raise _Unsupported("list of non-literals")
                items.append(value)
                if self.peek() == ",":
                    self.take()
            self.take("]")
            return items
        if kind == "ident" and text == "device":
            self.take(".")
            _, field = self.take()
            if field == "driver":
                return lambda d, a: d
            if field != "attributes":
                raise _Unsupported(f"device.{field}")
            self.take("[")
            kind, dom = self.take()
            if kind != "str":
                raise _Unsupported("attribute domain")
            self.take("]")
            if self.peek() == ".":
                self.take(".")
                _, name = self.take()
            else:
                self.take("[")
                kind, quoted = self.take()
                if kind != "str":
                    raise _Unsupported("attribute name")
                name = _unquote(quoted)
                self.take("]")
            key = f"{_unquote(dom)}/{name}"
            return lambda d, a: a.get(key)
        raise _Unsupported(text)

    def comparison(self) -> Predicate:
        left = self.operand()
        op = self.peek()
        if op is None or op in (")", "&&", "||"):
            if callable(left):
                getter = left
                return lambda d, a: getter(d, a) is True
            if isinstance(left, bool):
                return lambda d, a: left
            raise _Unsupported("bare operand")
        self.take()
        right = self.operand()
        return _compare(left, op, right)


def _compare(left: object, op: str, right: object) -> Predicate:
    def value(x: object, d: str, a: Attributes) -> object:
        return x(d, a) if callable(x) else x

    def check(d: str, a: Attributes) -> bool:
        lv, rv = value(left, d, a), value(right, d, a)
        if lv is None or rv is None:
            return False  # a missing attribute is a CEL error: the device does not match
        if op == "==":
            return lv == rv
        if op == "!=":
            return lv != rv
        if op == "in" and isinstance(rv, list):
            return lv in rv
        if isinstance(lv, int) and isinstance(rv, int):
            return {"<": lv < rv, "<=": lv <= rv, ">": lv > rv, ">=": lv >= rv}.get(op, False)
        return False

    return check


def _all(terms: list[Predicate]) -> Predicate:
    return lambda d, a: all(t(d, a) for t in terms)


def _any(terms: list[Predicate]) -> Predicate:
    return lambda d, a: any(t(d, a) for t in terms)


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def UNKNOWN(driver: str, attributes: Attributes) -> bool:  # noqa: N802 - a constant-like predicate
    """The predicate for a selector the pre-filter does not understand: matches everything."""
    return True


def compile_selector(expression: str) -> Predicate | None:
    """A predicate for one CEL selector, or None when it is outside the supported subset."""
    if len(expression) > MAX_EXPRESSION:
        return None
    try:
        toks = _tokens(expression)
        # 'in' arrives as an identifier: turn it into an operator token.
        toks = [("op", "in") if t == ("ident", "in") else t for t in toks]
        parser = _Parser(toks)
        pred = parser.expr()
        if parser.i != len(toks):
            return None
        return pred
    except (_Unsupported, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Compiled:
    """All selectors of a class and a gang, and-ed; ``unsupported`` lists the ones treated as match-all."""

    predicate: Predicate
    unsupported: tuple[str, ...]


def compile_all(expressions: Iterable[str]) -> Compiled:
    """And-combine ``expressions``; unsupported ones match everything and are listed."""
    preds: list[Predicate] = []
    unsupported: list[str] = []
    for expr in expressions:
        pred = compile_selector(expr)
        if pred is None:
            unsupported.append(expr)
        else:
            preds.append(pred)

    def matches(driver: str, attributes: Attributes) -> bool:
        return all(p(driver, attributes) for p in preds)

    return Compiled(predicate=matches, unsupported=tuple(unsupported))


def class_selectors(device_class: ClassView | None) -> tuple[str, ...]:
    """The CEL expressions of a DeviceClass (None: no class, none)."""
    return device_class.selectors if device_class is not None else ()
