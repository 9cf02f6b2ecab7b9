"""capture.py: what libraries say during an item goes to that item, from worker threads and from C code writing
to fd 2, while the tool's own lines still reach the real stderr."""

from __future__ import annotations

import ctypes
import io
import logging
import sys
import threading
import warnings

from gemma_embed import capture
from gemma_embed.progress import Reporter

LIBC = ctypes.CDLL(None)


def c_write_stderr(text: str) -> None:
    """What a C library does: write(2) from native code, past Python's sys.stderr."""
    data = text.encode()
    LIBC.write(2, data, len(data))


def test_warnings_go_to_the_item_of_the_thread_that_warns_every_time():
    start = threading.Barrier(2)
    results = {}

    def work(key: str) -> None:
        with capture.item(key) as messages:
            start.wait()
            for _ in range(3):
                warnings.warn(f"odd palette in {key}", UserWarning, stacklevel=1)
        results[key] = messages.texts()

    before = warnings.showwarning, list(warnings.filters)
    with capture.Capture(fd=False):
        threads = [threading.Thread(target=work, args=(k,)) for k in ("a.png", "b.png")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with capture.item("c.png") as later:  # the same code location again: Python's registry must not hide it
            warnings.warn("odd palette in a.png", UserWarning, stacklevel=1)
    assert results == {
        "a.png": ["UserWarning: odd palette in a.png (3 times)"],
        "b.png": ["UserWarning: odd palette in b.png (3 times)"],
    }
    assert later.texts() == ["UserWarning: odd palette in a.png"]
    assert (warnings.showwarning, list(warnings.filters)) == before


def test_ignored_categories_stay_ignored():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # as Python's default filters do outside __main__
        with capture.Capture(fd=False), capture.item("x") as messages:
            warnings.warn("old api", DeprecationWarning, stacklevel=1)
            warnings.warn("odd file", UserWarning, stacklevel=1)
    assert messages.texts() == ["UserWarning: odd file"]


def test_transformers_logging_is_attached_and_its_handlers_restored():
    from transformers.utils import logging as hf_logging

    library = logging.getLogger("transformers")
    before = list(library.handlers), library.propagate
    with capture.Capture(fd=False), capture.item("frame.mp4") as messages:
        hf_logging.get_logger("transformers.image_utils").warning("The channel dimension is ambiguous.")
    assert messages.texts() == ["transformers.image_utils: The channel dimension is ambiguous."]
    assert (list(library.handlers), library.propagate) == before


def fd2_stream():
    """A text stream on fd 2, as sys.stderr is in the command (pytest's own sys.stderr is another fd)."""
    return open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - fd 2 stays open


def test_fd2_lines_from_c_go_to_the_items_decoding_and_the_tools_lines_to_the_real_stderr(capfd, monkeypatch):
    monkeypatch.setattr(sys, "stderr", fd2_stream())
    reporter = Reporter(stdout=io.StringIO(), live=False)
    assert reporter.stderr.fileno() == 2
    seen = {}
    with capture.Capture(reporter) as captured:
        reporter.note("the tool's own line")

        def decode(key: str, text: str) -> None:
            with capture.item(key) as messages, capture.native():
                # libtiff-style: one message in three writes
                c_write_stderr("tempfile.tif: ")
                c_write_stderr(text)
                c_write_stderr(".\n")
                seen[key] = capture.current_messages()  # read up to now, inside the item
            seen[key + " at end"] = messages.texts()

        decode("broken.tif", "WEBP compression support is not configured")
        decode("odd.tif", "Unknown field with tag 65000")
        print("a library printing to sys.stderr", file=sys.stderr)
        c_write_stderr("outside any item\n")
        reporter.note("still the tool's")
    out, err = capfd.readouterr()
    assert err.splitlines() == ["note: the tool's own line", "note: still the tool's"]
    assert seen["broken.tif"] == ["stderr: tempfile.tif: WEBP compression support is not configured."]
    assert seen["odd.tif at end"] == ["stderr: tempfile.tif: Unknown field with tag 65000."]
    assert captured.outside == 2  # the print and the write outside any item: counted, not attached, not shown
    assert reporter.stderr is sys.stderr  # handed back


def test_two_threads_decoding_at_once_both_get_the_line_marked_as_shared():
    inside = threading.Barrier(2)
    done = threading.Barrier(2)
    texts = {}

    def decode(key: str, writes: bool) -> None:
        with capture.item(key) as messages, capture.native():
            inside.wait()
            if writes:
                c_write_stderr("libfoo: something odd\n")
            done.wait()
        texts[key] = messages.texts()

    with capture.Capture():
        threads = [threading.Thread(target=decode, args=(k, k == "a")) for k in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert texts == {k: ["stderr: libfoo: something odd (while 2 items were decoding)"] for k in ("a", "b")}


def test_debug_shows_messages_live_with_the_key(capfd):
    reporter = Reporter(stderr=fd2_stream(), stdout=io.StringIO(), live=False, debug=True)
    with capture.Capture(reporter), capture.item("x.gif"), capture.native():
        warnings.warn("transparency in bytes", UserWarning, stacklevel=1)
        c_write_stderr("native says hi\n")
        capture.current_messages()
    _, err = capfd.readouterr()
    assert err.splitlines() == [
        "warning: x.gif: UserWarning: transparency in bytes",
        "warning: x.gif: stderr: native says hi",
    ]


def test_without_a_capture_nothing_is_rerouted(capfd):
    with capture.item("x"), capture.native():
        c_write_stderr("plain\n")
        assert capture.current_messages() == []
    assert capfd.readouterr().err == "plain\n"


def test_a_live_progress_bar_keeps_drawing_on_the_real_stderr(capfd):
    from gemma_embed.result import RunResult

    reporter = Reporter(stderr=fd2_stream(), stdout=io.StringIO(), live=True)
    result = RunResult()
    reporter.start("images", result)  # the bar's console is made before the capture starts
    with capture.Capture(reporter):
        c_write_stderr("foreign\n")
        result.item_done(3)
        reporter.item_done("a.png", 3)
        reporter.finish(result.finish())
    err = capfd.readouterr().err
    assert "images" in err and "1 ok, 0 failed" in err and "foreign" not in err


def test_an_item_keeps_at_most_a_bounded_number_of_distinct_messages():
    with capture.Capture(fd=False), capture.item("noisy.gif") as messages:
        for frame in range(capture.MAX_DISTINCT + 5):
            warnings.warn(f"frame {frame}: odd disposal", UserWarning, stacklevel=1)
    texts = messages.texts()
    assert len(texts) == capture.MAX_DISTINCT + 1 and texts[-1] == "... and 5 more messages, not kept"
