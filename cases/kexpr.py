"""A small pytest-like ``-k`` expression matcher over case ids.

Grammar (case-insensitive substring match, like pytest):

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | primary
    primary := "(" expr ")" | WORD

A WORD is any run of characters other than whitespace and parentheses, so ids (which contain
"[", "]", "/", "_", ".") can be pasted whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
_KEYWORDS = ("and", "or", "not")


class KExprError(ValueError):
    pass


def _tokenize(expression: str) -> list[str]:
    tokens, position = [], 0
    while position < len(expression):
        if expression[position:].strip() == "":
            break
        match = _TOKEN.match(expression, position)
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def compile_k(expression: str) -> Callable[[str], bool]:
    """Compile `expression` into a predicate over an id string. Raises KExprError on bad syntax."""
    tokens = _tokenize(expression)
    if not tokens:
        raise KExprError(f"empty -k expression {expression!r}")
    position = 0

    def peek():
        return tokens[position] if position < len(tokens) else None

    def take():
        nonlocal position
        token = peek()
        position += 1
        return token

    def parse_or():
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda s: a(s) or b(s))(left, right)
        return left

    def parse_and():
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda s: a(s) and b(s))(left, right)
        return left

    def parse_not():
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda s: not inner(s)
        return parse_primary()

    def parse_primary():
        token = take()
        if token is None:
            raise KExprError(f"-k expression {expression!r} ends where a word or '(' was expected")
        if token == "(":
            inner = parse_or()
            if take() != ")":
                raise KExprError(f"-k expression {expression!r}: missing ')'")
            return inner
        if token == ")" or token in _KEYWORDS:
            raise KExprError(f"-k expression {expression!r}: unexpected {token!r}")
        needle = token.lower()
        return lambda s: needle in s.lower()

    predicate = parse_or()
    if position != len(tokens):
        raise KExprError(f"-k expression {expression!r}: unexpected {tokens[position]!r}")
    return predicate
