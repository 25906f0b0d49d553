"""What a JSON schema may ask of the engine's grammar compiler, checked before it is sent.

vLLM compiles a ``response_format`` schema into a grammar (xgrammar) per request. Two kinds
of ``pattern`` fail or stall it, and the engine answers either with a bare 500 that the
gateway cannot tell from a crash:

- a bounded repetition above ``MAX_REPEAT`` (vLLM's CPU build 0.32 fails ``a{1,129}`` and
  compiles ``a{1,128}``);
- nested bounded repetitions whose product is large: ``(a{1,100}){1,100}`` compiles, in
  4 s of the engine's CPU; ``(a{1,200}){1,200}`` fails after seconds.

So a pattern is refused here, as the caller's error naming the field, when one bounded
repetition exceeds ``MAX_REPEAT`` or the nested product exceeds ``MAX_EXPANSION``. Unbounded
repetitions (``*``, ``+``, ``{2,}``) are loops to the compiler and cost nothing extra. A
pattern Python's ``re`` cannot parse is left to the engine (its syntax is ECMA-262's).
"""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parse
from collections.abc import Iterator
from typing import Any

#: The largest bounded repetition the engine compiles.
MAX_REPEAT = 128
#: The largest product of nested bounded repetitions accepted (engine compile cost).
MAX_EXPANSION = 1024
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT)


class PatternTooComplex(ValueError):
    """A schema ``pattern`` the engine's grammar compiler would fail on or stall."""


def check_patterns(schema: Any, where: str = "") -> None:
    """Raise ``PatternTooComplex`` naming the first ``pattern`` (or ``patternProperties``
    key) of ``schema`` over the limits."""
    for path, pattern in _patterns(schema, where):
        try:
            parsed = sre_parse.parse(pattern)
        except (re.error, RecursionError, OverflowError):
            continue
        repeats = Repeats()
        expansion = repeats.walk(parsed)
        if repeats.largest > MAX_REPEAT:
            raise PatternTooComplex(
                f"{path}: a bounded repetition of {repeats.largest} is more than the "
                f"{MAX_REPEAT} the engine compiles"
            )
        if expansion > MAX_EXPANSION:
            raise PatternTooComplex(
                f"{path}: nested bounded repetitions expand to {expansion} (at most "
                f"{MAX_EXPANSION})"
            )


def _patterns(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if key == "pattern" and isinstance(value, str):
                yield here, value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from ((f"{here}.{name}", name) for name in value if isinstance(name, str))
            yield from _patterns(value, here)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _patterns(item, f"{path}[{index}]")


class Repeats:
    """Walks a parsed pattern: the largest product of nested bounded repetitions, and
    (``largest``) the largest single bound."""

    def __init__(self) -> None:
        self.largest = 0

    def walk(self, items: Any) -> int:
        product = 1
        for op, argument in items:
            if op in _REPEATS:
                low, high, body = argument
                inner = self.walk(body)
                if high == sre_constants.MAXREPEAT:
                    factor = max(1, low)  # a loop, plus its required copies
                    self.largest = max(self.largest, low)
                else:
                    factor = high
                    self.largest = max(self.largest, high)
                product = max(product, factor * inner)
            elif op == sre_constants.SUBPATTERN:
                product = max(product, self.walk(argument[-1]))
            elif op == sre_constants.BRANCH:
                product = max(product, *(self.walk(branch) for branch in argument[1]))
            elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
                product = max(product, self.walk(argument[1]))
            elif op == sre_constants.GROUPREF_EXISTS:
                product = max(product, *(self.walk(b) for b in argument[1:] if b is not None))
        return product
