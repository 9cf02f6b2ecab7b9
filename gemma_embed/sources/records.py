"""JSON-lines records as the tool reads them: parsed with a depth limit (`nested_json`: a record nested deeper than
128 levels fails by key, where Python's parser raised RecursionError), and a record longer than the bytes kept of
it (sources/bounded.py) read as far as it goes, so that its text can be cut like a long line of a text file.
"""

from __future__ import annotations

import json
import re
from json import decoder

from gemma_embed import nested_json
from gemma_embed.errors import ItemProblem

# The C scanner json.loads uses for strings: (the string, the index after its closing quote) from the index after
# its opening quote (not in typeshed's stubs).
scanstring = decoder.scanstring  # type: ignore[attr-defined]

_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _too_deep(row: int) -> ItemProblem:
    return ItemProblem(f"row {row} nests deeper than {nested_json.MAX_DEPTH} levels: not read", "too-deep")


def parse(data: bytes, row: int) -> dict:
    """A whole record line -> its object; ItemProblem (undecodable, too-deep) for anything else."""
    try:
        record = nested_json.loads(data)
    except nested_json.TooDeep:
        raise _too_deep(row) from None
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError
        raise ItemProblem(f"row {row} is not JSON ({_one_line(exc)})", "undecodable") from None
    if not isinstance(record, dict):
        raise ItemProblem(f"row {row} is not a JSON object", "undecodable")
    return record


def parse_beginning(data: bytes, row: int) -> tuple[dict, str | None]:
    """The members of a record of which only `data`, its beginning, was read: every member whole in it, and the
    member whose string value the end of `data` cuts (its value: the string's beginning), named second (None when
    the cut falls elsewhere). The members after the cut are not known."""
    if nested_json.depth(data) > nested_json.MAX_DEPTH:
        raise _too_deep(row)
    cut = len(data)
    while cut > len(data) - 4:  # a UTF-8 sequence the cut splits
        try:
            text = data[:cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            cut -= 1
    else:
        raise ItemProblem(f"row {row} is not UTF-8 text", "undecodable")
    decoder = json.JSONDecoder()
    at = _skip(text, 0)
    if not text.startswith("{", at):
        raise ItemProblem(f"row {row} is not a JSON object", "undecodable")
    members: dict = {}
    at = _skip(text, at + 1)
    while at < len(text) and text[at] == '"':
        try:
            name, at = scanstring(text, at + 1)
        except ValueError:
            return members, None  # the cut falls in a name
        at = _skip(text, at)
        if not text.startswith(":", at):
            return members, None
        at = _skip(text, at + 1)
        if text.startswith('"', at):
            try:
                value, at = scanstring(text, at + 1)
            except json.JSONDecodeError as exc:
                # Unterminated: the cut falls in this string (or in an escape at its end, which scanstring names).
                if not (exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 12):
                    raise ItemProblem(f"row {row} is not JSON ({_one_line(exc)})", "undecodable") from None
                try:
                    value = scanstring(_without_cut_escape(text[at + 1 :]) + '"', 0)[0]
                except ValueError as again:
                    raise ItemProblem(f"row {row} is not JSON ({_one_line(again)})", "undecodable") from None
                return {**members, name: value}, name
        else:
            try:
                value, at = decoder.raw_decode(text, at)
            except ValueError:
                return members, None  # the cut falls in a list or an object (or true, false, null)
            if at == len(text):
                return members, None  # a number the cut may have shortened
        members[name] = value
        at = _skip(text, at)
        if not text.startswith(",", at):
            break
        at = _skip(text, at + 1)
    return members, None


def _without_cut_escape(rest: str) -> str:
    """A string's text the cut ends, without an escape the cut falls in: a lone backslash, `\\u` with fewer than
    four digits, or a high surrogate whose pair is cut off (also one before a cut escape)."""
    while True:
        start = rest.rfind("\\", max(0, len(rest) - 6))
        if start < 0:
            return rest
        before = start
        while before > 0 and rest[before - 1] == "\\":
            before -= 1
        if (start - before) % 2:  # this backslash is the second of an escaped one
            return rest
        escape = rest[start:]
        partial = len(escape) == 1 or (escape[1] == "u" and len(escape) < 6)
        if not partial and not (escape[1] == "u" and escape[2:4].lower() in ("d8", "d9", "da", "db")):
            return rest
        rest = rest[:start]


def _skip(text: str, at: int) -> int:
    match = _WHITESPACE.match(text, at)
    return match.end() if match is not None else at


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
