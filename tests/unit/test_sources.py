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


# Extensions Pillow registers that the walk leaves out, and why it cannot decode them here: save-only formats,
# stub plugins without a handler, EPS without Ghostscript, MPEG (header only).
NOT_DECODABLE_HERE = {".pdf", ".palm", ".bufr", ".grib", ".h5", ".hdf", ".wmf", ".emf", ".eps", ".ps"}
NOT_DECODABLE_HERE |= {".mpg", ".mpeg"}


def write_every_pillow_extension(folder) -> dict[str, bool]:
    """One file per extension Pillow registers: written by Pillow where it has an encoder for the format
    (-> True when Pillow reads it back here), a placeholder otherwise (-> False)."""
    from PIL import Image

    Image.init()
    folder.mkdir()
    logo = Image.new("RGBA", (24, 16), (200, 30, 60, 128))
    made = {}
    for ext, fmt in sorted(Image.registered_extensions().items()):
        path = folder / f"file{ext}"
        made[ext] = False
        for mode in ("RGBA", "RGB", "P", "L", "1"):
            try:
                logo.convert(mode).save(path, format=fmt)
                with Image.open(path) as back:
                    back.load()
                made[ext] = True
                break
            except Exception:  # noqa: BLE001 - no encoder, wrong mode, or no decoder here
                continue
        if not made[ext]:
            path.write_bytes(b"placeholder")
    return made


def test_walk_takes_every_extension_pillow_opens_and_counts_what_it_passes_over(tmp_path):
    from collections import Counter

    from PIL import Image

    from gemma_embed.media.image import decode_image

    made = write_every_pillow_extension(tmp_path / "all")
    (tmp_path / "all" / "notes.txt").write_text("not an image")
    skipped = Counter()
    walked = {s.path.rsplit(".", 1)[-1] for s in iter_sources([str(tmp_path / "all")], "images", skipped=skipped)}
    walked = {f".{e}" for e in walked}
    readable = {ext for ext, ok in made.items() if ok}
    assert readable <= walked, sorted(readable - walked)  # every file Pillow wrote and reads back is found
    assert len(readable) >= 40 and {".apng", ".avif", ".ico", ".jp2", ".tga", ".qoi", ".dds", ".pcx"} <= readable
    left_out = set(made) - walked
    assert left_out <= NOT_DECODABLE_HERE, sorted(left_out - NOT_DECODABLE_HERE)
    assert not (left_out & readable)
    assert sum(skipped.values()) == len(left_out) + 1 and skipped[".txt"] == 1
    for ext in sorted(readable):  # and each decodes through the tool's decoder, at the size Pillow reads
        path = tmp_path / "all" / f"file{ext}"
        decoded = decode_image(str(path))
        with Image.open(path) as back:
            assert decoded.image.mode == "RGB" and decoded.image.size == back.size, ext

    # --ext restricts the walk; what it passes over is counted.
    skipped = Counter()
    chosen = list(iter_sources([str(tmp_path / "all")], "images", ext=(".png", ".jpg"), skipped=skipped))
    assert sorted(s.key for s in chosen) == ["file.jpg", "file.png"]
    assert sum(skipped.values()) == len(made) + 1 - 2


def test_ext_option_parses_and_reaches_the_walk(tmp_path):
    import pytest

    from gemma_embed.config import RunConfig
    from gemma_embed.sources import parse_extensions

    assert parse_extensions("jpg, .PNG,jpg") == (".jpg", ".png")
    assert RunConfig(ext="webp").ext == (".webp",) and RunConfig().ext is None
    for bad in (",", "a/b"):
        with pytest.raises(ValueError):
            parse_extensions(bad)


def test_directories_in_a_stdin_list_are_walked_like_arguments(tmp_path):
    touch(tmp_path / "album" / "a.jpg")
    touch(tmp_path / "album" / "deep" / "b.png")
    touch(tmp_path / "album" / "c.txt")
    single = touch(tmp_path / "single.gif")
    listing = io.BytesIO(f"{tmp_path / 'album'}\n{single}\n".encode())
    from collections import Counter

    skipped = Counter()
    sources = list(iter_sources(["-"], "images", stdin=listing, skipped=skipped))
    assert [s.key for s in sources] == ["a.jpg", "deep/b.png", str(single)]
    assert all(s.error is None for s in sources) and skipped == {".txt": 1}


def test_audio_walk_takes_video_containers_for_their_soundtracks(tmp_path):
    for name in ("a.wav", "b.mp3", "c.m4a", "d.mp4", "e.webm", "f.mkv", "g.opus", "h.aiff", "i.gif", "j.txt"):
        touch(tmp_path / name)
    keys = [s.key for s in iter_sources([str(tmp_path)], "audio")]
    assert keys == ["a.wav", "b.mp3", "c.m4a", "d.mp4", "e.webm", "f.mkv", "g.opus", "h.aiff"]
    video = [s.key for s in iter_sources([str(tmp_path)], "video")]
    assert video == ["d.mp4", "e.webm", "f.mkv", "i.gif"]
