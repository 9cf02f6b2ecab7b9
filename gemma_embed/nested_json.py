"""JSON with a nesting limit: Python's parser recurses, and past about a thousand levels (fewer deep in a stack)
raises RecursionError; what parses below that is later written out and read back by other code that recurses again
(metadata dumps, export's flattening). So a document nested deeper than MAX_DEPTH levels is refused before it is
parsed. 128 is what serde_json allows by default, and no corpus record or output of this tool comes near it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 128

# A JSON string (quotes and escapes), taken out before brackets are counted; as bytes and as text.
_STRING: dict[type, re.Pattern[Any]] = {
    bytes: re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL),
    str: re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL),
}
_BRACKET: dict[type, re.Pattern[Any]] = {bytes: re.compile(rb"[\[\]{}]"), str: re.compile(r"[\[\]{}]")}
_OPENING: dict[type, tuple[Any, Any]] = {bytes: (b"[", b"{"), str: ("[", "{")}
_EMPTY: dict[type, Any] = {bytes: b'""', str: '""'}


class TooDeep(ValueError):
    """A JSON document nested deeper than the limit."""


def depth(data: bytes | str, limit: int = MAX_DEPTH) -> int:
    """How deeply the JSON in `data` nests (objects and arrays), strings left out; counted only as far as needed to
    know it is past `limit`. Cheap: most documents have fewer brackets than the limit, and then nothing is scanned."""
    kind = type(data)
    opening = _OPENING[kind]
    if data.count(opening[0]) + data.count(opening[1]) <= limit:
        return 0
    deepest = level = 0
    for bracket in _BRACKET[kind].finditer(_STRING[kind].sub(_EMPTY[kind], data)):
        level += 1 if bracket.group() in opening else -1
        if level > deepest:
            deepest = level
            if deepest > limit:
                break
    return deepest


def loads(data: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """json.loads, refusing a document nested deeper than `limit` (TooDeep, a ValueError) before parsing it."""
    if depth(data, limit) > limit:
        raise TooDeep(f"nested deeper than {limit} levels")
    try:
        return json.loads(data)
    except RecursionError:  # the limit keeps far from it; a parser that recursed deeper still names it
        raise TooDeep(f"nested deeper than {limit} levels") from None
