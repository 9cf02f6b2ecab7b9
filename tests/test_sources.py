from __future__ import annotations

import io
import os

from gemma_embed.sources import iter_sources


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_folders_recursive_sorted_filtered(tmp_path):
    for name in ("b.jpg", "a.PNG", "sub/c.webp", "sub/deeper/d.jpeg", "notes.txt", "clip.mp4"):
        touch(tmp_path / name)
    keys = [s.key for s in iter_sources([str(tmp_path)], "images")]
    assert keys == ["a.PNG", "b.jpg", "sub/c.webp", "sub/deeper/d.jpeg"]


def test_files_keep_the_path_as_given_and_duplicates_go(tmp_path):
    a = touch(tmp_path / "a.jpg")
    os.symlink(a, tmp_path / "link.jpg")
    sources = list(iter_sources([str(a), str(tmp_path / "link.jpg"), str(tmp_path), str(a)], "images"))
    assert [s.key for s in sources] == [str(a)]  # the link and the folder's copy resolve to the same file


def test_missing_path_is_an_item_with_an_error(tmp_path):
    (sources,) = [list(iter_sources([str(tmp_path / "nope.jpg")], "images"))]
    assert sources[0].error and "no such file" in sources[0].error


def test_stdin_lists_newline_and_nul(tmp_path):
    a, b = touch(tmp_path / "a.jpg"), touch(tmp_path / "b b.jpg")
    lines = io.BytesIO(f"{a}\n\n{b}\n".encode())
    assert [s.path for s in iter_sources(["-"], "images", stdin=lines)] == [str(a), str(b)]
    nul = io.BytesIO(f"{b}\0{a}\0".encode())
    assert [s.path for s in iter_sources(["-"], "images", stdin=nul, null_separated=True)] == [str(b), str(a)]


def test_non_utf8_names_survive(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/caf\xe9.jpg"
    with open(raw, "wb") as fh:
        fh.write(b"x")
    (source,) = iter_sources(["-"], "images", stdin=io.BytesIO(raw + b"\n"))
    assert os.path.exists(source.path)
    (walked,) = iter_sources([str(tmp_path)], "images")
    assert os.path.exists(walked.path)


def test_key_collision_between_folders_gets_the_folder_prefix(tmp_path):
    touch(tmp_path / "one" / "x.jpg")
    touch(tmp_path / "two" / "x.jpg")
    keys = [s.key for s in iter_sources([str(tmp_path / "one"), str(tmp_path / "two")], "images")]
    assert keys == ["x.jpg", f"{tmp_path / 'two'}/x.jpg"]
