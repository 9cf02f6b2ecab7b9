"""Names reach the terminal escaped: `terminal.printable`, and every line and table that shows people a name."""

from __future__ import annotations

import io
import json

from gemma_embed.errors import ItemError
from gemma_embed.progress import Reporter
from gemma_embed.result import RunResult
from gemma_embed.terminal import printable

HOSTILE = "a\x1b]0;owned\x07b\nnote: all 1000 items verified\tc\x7fd\x9be\u202ef"


def control_bytes(data: bytes) -> list[int]:
    """The bytes a terminal acts on, the line-ending newlines left out."""
    return [b for b in data.replace(b"\n", b"") if b < 0x20 or b == 0x7F]


def test_printable_escapes_every_control_character_and_keeps_the_rest():
    assert printable("plain name.png") == "plain name.png"
    assert printable("ünïcødé 写真 🙂.jpg") == "ünïcødé 写真 🙂.jpg"
    assert printable("back\\slash") == "back\\slash"
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("bell\x07") == "bell\\x07"
    assert printable("two\nlines\ttab\rcr") == "two\\nlines\\ttab\\rcr"
    assert printable("\x00\x7f\x85\x9f") == "\\x00\\x7f\\x85\\x9f"  # NUL, DEL, C1 (NEL, APC)
    assert printable("rtl\u202eoverride\u2066") == "rtl\\u202eoverride\\u2066"
    assert printable("sep\u2028x") == "sep\\u2028x"
    undecodable = b"caf\xe9.png".decode("utf-8", "surrogateescape")  # a Latin-1 name on a UTF-8 system
    assert printable(undecodable) == "caf\\xe9.png"
    assert printable("lone \ud800") == "lone \\ud800"
    out = printable(HOSTILE)
    assert out.isprintable() and printable(out) == out


def test_reporter_lines_hold_no_control_byte_and_json_keeps_the_exact_name():
    stdout, stderr = io.StringIO(), io.StringIO()
    reporter = Reporter(jsonl=True, stdout=stdout, stderr=stderr, live=False, debug=True)
    reporter.start("images", RunResult())
    error = ItemError(HOSTILE, "decode", "cannot identify image file")
    error.traceback_text = f"Traceback (most recent call last):\n  File {HOSTILE}\nValueError: {HOSTILE}\n"
    reporter.item_failed(error)
    reporter.note(f"kept {HOSTILE}")
    reporter.warning(f"odd {HOSTILE}")
    reporter.library_message(HOSTILE, "a library said \x1b[31mred\x1b[0m")
    reporter.item_done(HOSTILE, rows=1)
    reporter.finish(RunResult(output=HOSTILE))
    err = stderr.getvalue()
    assert control_bytes(err.encode()) == []
    lines = err.splitlines()
    assert f"error: {printable(HOSTILE)}: cannot identify image file" in lines
    assert not any(line.startswith("note: all 1000") for line in lines)  # the newline forged no line
    assert "  Traceback (most recent call last):" in lines  # --debug's traceback, indented under its error
    assert f"note: kept {printable(HOSTILE)}" in lines and f"warning: odd {printable(HOSTILE)}" in lines
    assert lines[-1].endswith(f"-> {printable(HOSTILE)}")
    records = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert [r["key"] for r in records if r["type"] == "item"] == [HOSTILE, HOSTILE]
    assert records[-1]["output"] == HOSTILE


def test_live_progress_shows_names_as_text_not_markup():
    stderr = io.StringIO()
    reporter = Reporter(stderr=stderr, stdout=io.StringIO(), live=True)
    reporter.start(f"images [bold red]{HOSTILE}[/]", RunResult())
    reporter.item_failed(ItemError("[/] [link=file:///etc/passwd]x[/link] :smile:", "decode", "bad"))
    reporter.finish(RunResult())
    err = stderr.getvalue()
    assert control_bytes(err.encode()) == []
    assert "error: [/] [link=file:///etc/passwd]x[/link] :smile:: bad" in err.splitlines()
    assert "images [bold red]a\\x1b]0;owned" in err  # the description is shown, its markup as text


def test_search_table_escapes_keys_and_paths():
    from gemma_embed.search import SearchHit, render_jsonl, render_table

    hit = SearchHit(1, 0.5, HOSTILE, f"/data/{HOSTILE}", row=0, frame=None, timestamp=None, item={})
    table = render_table([hit])
    assert control_bytes(table.encode()) == [] and len(table.splitlines()) == 2
    assert printable(HOSTILE) in table.splitlines()[1]
    (record,) = [json.loads(line) for line in render_jsonl([hit]).splitlines()]
    assert record["key"] == HOSTILE and record["path"] == f"/data/{HOSTILE}"
