"""What the tool writes for people: names made safe to show on a terminal.

Keys, paths and messages come from file names, tar members, parquet cells and library text, and any of them may
hold bytes a terminal acts on: ESC starts a sequence that moves the cursor, clears the screen or sets the window
title; a newline forges a line of the tool's own (`note: all items verified`). `printable` is the one place that
turns those into visible escapes; every line on stderr and every table cell goes through it. JSON output does not:
`json.dumps(..., ensure_ascii=True)` already writes every such character as a `\\uXXXX` escape, so records keep
the exact name.
"""

from __future__ import annotations

import unicodedata

from gemma_embed.redact import redact

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
# Format characters that reorder the text after them on screen (bidirectional embeddings, overrides, isolates
# and marks): a name can show as another name. Other format characters (zero-width joiners in emoji) are kept.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# surrogateescape (how Python decodes a non-UTF-8 file name) maps byte 0xNN to the lone surrogate U+DCNN.
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def printable(text: str) -> str:
    """`text` with every character a terminal would act on shown as an escape: C0 controls, DEL and C1 controls
    as `\\xNN` (newline, tab and carriage return as `\\n`, `\\t`, `\\r`), a byte of a non-UTF-8 name as `\\xNN`,
    other lone surrogates, line/paragraph separators and bidirectional controls as `\\uXXXX`. Everything else,
    backslashes included, is left as it is, so an ordinary name shows unchanged. No secret is shown either: a
    URL's credentials and query string, the environment's credential values (`redact.redact`)."""
    text = redact(str(text))
    if text.isprintable():  # no control, format, surrogate or separator character: the common case, unchanged
        return text
    out = []
    for char in text:
        code = ord(char)
        if char in _NAMED:
            out.append(_NAMED[char])
        elif code < 0x20 or 0x7F <= code <= 0x9F:
            out.append(f"\\x{code:02x}")
        elif code in _ESCAPED_BYTES:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in _BIDI or unicodedata.category(char) in ("Cs", "Zl", "Zp"):
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


ELLIPSIS = "\u2026"


def cut_to_width(text: str, columns: int, cut: bool = False) -> str:
    """`text` in at most `columns` terminal columns (a wide character, as CJK, takes two: rich's measure), ending
    in an ellipsis where it was cut here or is already the beginning of a longer text (`cut`)."""
    from rich.cells import cell_len

    if cell_len(text) <= columns and not cut:
        return text
    room = max(0, columns - 1)
    kept, used = [], 0
    for char in text:
        size = cell_len(char)
        if used + size > room:
            break
        kept.append(char)
        used += size
    return "".join(kept) + ELLIPSIS


def shows_summary(stdout, asked: bool = False) -> bool:
    """Whether a command's closing JSON record goes to `stdout`: always for a program reading it (a pipe, a file,
    `$(...)`); onto a terminal only when `asked` (`--jsonl`: JSON records were asked for), since a person there
    has the summary line for people on stderr (the record used to follow it there, some 1,000 characters)."""
    if asked:
        return True
    try:
        return not stdout.isatty()
    except (AttributeError, ValueError):  # no such stream, or closed
        return True
    try:
        return not stdout.isatty()
    except (AttributeError, ValueError):  # no such stream, or closed
        return True
