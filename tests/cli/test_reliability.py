"""Nothing lost, nothing hangs: the bad-input matrix, kills and resume, a full or read-only disk."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import EXE, ROOT, SLOW_CLI, SLOW_EXE, TEST_MEDIA, write_image
from warm_cli import REPORT_VARIABLE, reported_pid

import gemma_embed

MODEL = ROOT / "samples" / "tiny-gemma4"


def without_root_privilege() -> list[str]:
    """Root reads any file whatever its mode; drop that capability so chmod 000 means what it says."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    return []


def gemma_embed_cmd(
    *args, stdin: str | bytes | None = None, env: dict | None = None, timeout: float = 180, prefix: list[str] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, EXE, *map(str, args)],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def png_bomb(path: Path, width: int = 30000, height: int = 30000) -> Path:
    """A tiny PNG whose header claims 900 megapixels: must be refused before any pixel is decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )
    return path


SAMPLES = ROOT / "samples" / "media"
# Per modality: two good sample files, and one whose halves make a truncated file the decoder must refuse
# (a WAV cut short still decodes, libsndfile reads what is there, so audio truncates a FLAC).
MATRIX = {
    "images": (["images/landscape.jpg", "images/portrait.png"], "images/landscape.jpg", ".jpg"),
    "video": (["video/clip-h264.mp4", "video/short-vp9.webm"], "video/clip-h264.mp4", ".mp4"),
    "audio": (["audio/chirp-16k.wav", "audio/stereo-44k.flac"], "audio/stereo-44k.flac", ".flac"),
}


REAL_BAD = TEST_MEDIA / "bad"
# The tool's own stderr lines: error:/warning:/note: lines and the closing summary line.
OWN_LINE = re.compile(r"^(error|warning|note): |^\d+ ok, \d+ failed")


def _modality_specific_bad_files(modality: str, folder: Path) -> dict[str, Path]:
    if modality == "images":
        # A libtiff that prints its reason on fd 2 while Pillow raises "decoder error -2".
        webp = Path(shutil.copy(REAL_BAD / "webp-compressed.tif", folder / "webp-compressed.tif"))
        return {"bomb": png_bomb(folder / "bomb.png"), "libtiff": webp}
    if modality == "video":
        from make_video_samples import write_audio_only

        return {"no video stream": write_audio_only(folder / "sound-only.mp4")}
    import numpy as np
    import soundfile

    silent = folder / "zero-samples.wav"
    soundfile.write(silent, np.zeros(0, dtype=np.float32), 16000)
    short = Path(shutil.copy(REAL_BAD / "five-samples.wav", folder / "five-samples.wav"))
    raw = Path(shutil.copy(REAL_BAD / "headerless.raw", folder / "headerless.raw"))
    return {"zero samples": silent, "too short": short, "headerless": raw}


@pytest.mark.parametrize("modality", list(MATRIX))
def test_bad_input_matrix(tmp_path, modality):
    goods, to_truncate, ext = MATRIX[modality]
    folder = tmp_path / "in"
    folder.mkdir()
    good = [Path(shutil.copy(SAMPLES / name, folder / Path(name).name)) for name in goods]
    good_weird = Path(os.fsdecode(os.fsencode(str(folder)) + b"/na\xefve" + os.fsencode(good[0].suffix)))
    shutil.copy(good[0], good_weird)  # a non-UTF-8 name on a good file: written, key intact
    good.append(good_weird)
    data = (SAMPLES / to_truncate).read_bytes()
    bad: dict[str, Path] = {
        "empty": folder / f"empty{ext}",
        "truncated": folder / f"truncated{ext}",
        "random bytes": folder / f"noise{ext}",
        "text": folder / f"notes{ext}",
        "dangling link": folder / f"dangling{ext}",
        "unreadable": folder / f"locked{ext}",
        "missing": folder / f"missing{ext}",
        "fifo": folder / f"pipe{ext}",
        "non-utf8 name": Path(os.fsdecode(os.fsencode(str(folder)) + b"/caf\xe9-broken" + os.fsencode(ext))),
    }
    bad["empty"].write_bytes(b"")
    bad["truncated"].write_bytes(data[: len(data) // 2])
    bad["random bytes"].write_bytes(os.urandom(4096))
    bad["text"].write_text("not media\n")
    os.symlink(folder / f"gone{ext}", bad["dangling link"])
    shutil.copy(good[0], bad["unreadable"])
    bad["unreadable"].chmod(0)
    os.mkfifo(bad["fifo"])
    album = folder / f"album{ext}"  # a folder in the list is walked like an argument (find also prints folders)
    album.mkdir()
    inside = Path(shutil.copy(good[1], album / f"inside{good[1].suffix}"))
    (album / "readme.txt").write_text("not media\n")  # passed over by the walk: counted as skipped
    bad["non-utf8 name"].write_bytes(b"\x00\x01 garbage" * 10)
    bad.update(_modality_specific_bad_files(modality, folder))

    listing = b"".join(os.fsencode(str(p)) + b"\0" for p in [good[0], *bad.values(), good[1], good[2], album])
    out = tmp_path / "out.safetensors"
    started = time.monotonic()
    proc = gemma_embed_cmd(
        modality,
        "-",
        "-0",
        "--model",
        MODEL,
        "-o",
        out,
        "--jsonl",
        # A video's good files need not be 32 frames each: what is tested is what happens to the bad ones.
        *(["--max-frames", "2"] if modality == "video" else []),
        stdin=listing,
        prefix=without_root_privilege(),
        timeout=240,
    )
    assert time.monotonic() - started < 240
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    foreign = [line for line in stderr.splitlines() if line.strip() and not OWN_LINE.match(line)]
    assert foreign == [], stderr  # libraries' messages go to the items' records, not to stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(bad), "\n".join(errors)
    for kind, path in bad.items():
        name = path.name if kind != "non-utf8 name" else f"caf\\xe9-broken{ext}"
        assert sum(name in line for line in errors) == 1, (kind, errors)
    assert any("permission denied" in line.lower() for line in errors)
    written = gemma_embed.load(out)
    assert list(written) == [str(p) for p in good] + [inside.name]
    records = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert len(records) == len(bad) and {r["stage"] for r in records} <= {"find", "decode", "prepare"}
    assert all(set(r) == {"key", "stage", "error", "message", "warnings"} for r in records)
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    assert summary["skipped"] == 1
    by_key = {r["key"]: r for r in records}
    causes = {
        "libtiff": "WEBP compression support is not configured",
        "too short": "too short: 5 samples at 11025 Hz",
        "headerless": "not an audio file (FFmpeg sees rawvideo)",
    }
    for kind, cause in causes.items():
        if kind in bad:
            assert cause in by_key[str(bad[kind])]["message"], by_key[str(bad[kind])]
    if "libtiff" in bad:  # the C library's own line, captured from fd 2, is in the record
        assert any(w.startswith("stderr: ") for w in by_key[str(bad["libtiff"])]["warnings"])
    # ... and the same warnings are in the --jsonl record of the item.
    items = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    failed = {r["key"]: r["warnings"] for r in items if r["type"] == "item" and r["status"] == "failed"}
    assert failed == {key: r["warnings"] for key, r in by_key.items()}


def _images(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [(64, 48), (48, 64), (100, 100), (300, 40), (40, 300)]
    for i in range(count):
        w, h = sizes[i % len(sizes)]
        write_image(folder / f"img{i:02d}.png", w, h, i)
    return folder


def _same_output(a: Path, b: Path) -> None:
    ra, rb = gemma_embed.load(a), gemma_embed.load(b)
    assert list(ra) == list(rb)
    for key in ra:
        assert torch.equal(ra[key], rb[key]), key
    ma, mb = gemma_embed.read_metadata(a), gemma_embed.read_metadata(b)
    assert ma == mb
    assert a.read_bytes() == b.read_bytes()  # and so the same file, byte for byte


def _start_and_stop(tmp_path, images, out, sig) -> subprocess.CompletedProcess:
    """A run of the images stopped by `sig` after its first four items (two parts at --flush-every 2): its fifth
    device batch is held (slow_gemma_embed.py --gate) until the signal comes, so it is running when signalled."""
    gate = tmp_path / "gate"
    gate.mkdir()
    for batch in range(4):
        (gate / str(batch)).touch()
    report = tmp_path / "report.json"  # the command's PID: SIGKILL goes to its own process (tests/warm_cli.py)
    args = [
        SLOW_CLI,
        "--gate",
        str(gate),
        "images",
        str(images),
        "--model",
        str(MODEL),
        "-o",
        str(out),
        "--flush-every",
        "2",
        "--batch-size",
        "1",
        "--max-soft-tokens",
        "70",
    ]
    env = {**os.environ, REPORT_VARIABLE: str(report)}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    parts = out.with_name(out.name + ".parts")
    deadline = time.monotonic() + 120  # only against a hang
    while len(list(parts.glob("part-*.safetensors"))) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no parts were flushed"
        time.sleep(0.05)
    if sig == signal.SIGKILL:  # what a SIGKILL leaves: the kernel ends the command's process, nothing else runs
        os.kill(reported_pid(report), sig)
    else:  # a signal its caller gets (a terminal's Ctrl-C, a hang-up), passed on by the launcher when forked
        proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, stdout.decode(), stderr.decode())


@pytest.fixture(scope="module")
def twelve_images(tmp_path_factory) -> tuple[Path, Path]:
    """12 images and their uninterrupted output (made in-process, once for every way of stopping a run)."""
    from helpers import run_images

    folder = tmp_path_factory.mktemp("twelve")
    images = _images(folder / "images", 12)
    reference = folder / "reference.safetensors"
    assert run_images([images], MODEL, reference, max_soft_tokens=70)[0] == 0
    return images, reference


@pytest.mark.parametrize(
    "sig",
    [signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT],
    ids=["SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT"],
)
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, sig, twelve_images):
    from helpers import run_images
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    images, reference = twelve_images
    out = tmp_path / "out.safetensors"
    stopped = _start_and_stop(tmp_path, images, out, sig)
    parts = out.with_name(out.name + ".parts")
    if sig != signal.SIGKILL:  # every stop signal saves what is done, says how to finish, exits 128 + its number
        assert stopped.returncode == 128 + sig, stopped.stderr
        assert "--resume" in stopped.stderr and "Traceback" not in stopped.stderr
        assert not out.with_name("out.lock").exists()  # the run ended itself: no lock file left behind
    else:
        assert stopped.returncode == -signal.SIGKILL
    assert not out.exists()
    saved = sum(len(gemma_embed.read_metadata(p)["keys"]) for p in parts.glob("part-*.safetensors"))
    assert 4 <= saved < 12
    assert not list(parts.glob("*.tmp"))

    again = CliRunner().invoke(app, ["images", str(images), "--model", str(MODEL), "-o", str(out)])
    assert again.exit_code == 2 and "--resume" in again.stderr  # never clobbers parts without --resume

    # The resume in-process: it reads what the killed process left on disk, as a new process would.
    code, records, err = run_images([images], MODEL, out, max_soft_tokens=70, resume=True, overwrite=False)
    assert code == 0, err
    statuses = [r.get("status") for r in records]
    assert statuses.count("resumed") == saved and statuses.count("ok") == 12 - saved
    _same_output(out, reference)
    assert not parts.exists()


def test_resume_redoes_changed_files_and_adds_new_ones(tmp_path):
    from helpers import run_images

    images = _images(tmp_path / "images", 4)
    out = tmp_path / "out.safetensors"
    assert run_images([images], MODEL, out, max_soft_tokens=70)[0] == 0
    write_image(images / "img01.png", 90, 30, 99)  # changed content, same key
    write_image(images / "img99.png", 30, 90, 98)  # new file
    code, records, _ = run_images([images], MODEL, out, max_soft_tokens=70, resume=True, overwrite=False)
    assert code == 0
    status = {r["key"]: r["status"] for r in records if r["type"] == "item"}
    assert status == {
        "img00.png": "resumed",
        "img01.png": "ok",
        "img02.png": "resumed",
        "img03.png": "resumed",
        "img99.png": "ok",
    }
    fresh = tmp_path / "fresh.safetensors"
    assert run_images([images], MODEL, fresh, max_soft_tokens=70)[0] == 0
    _same_output(out, fresh)
    # Settings that change the rows cannot be mixed into the same output.
    from gemma_embed.errors import UsageError

    with pytest.raises(UsageError, match="space"):
        run_images([images], MODEL, out, max_soft_tokens=70, resume=True, overwrite=False, space="tower")


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (not root); the in-process full-disk test still runs")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_full_disk_fails_cleanly(tmp_path, small_tmpfs):
    images = _images(tmp_path / "images", 10)
    out = small_tmpfs / "out.safetensors"
    proc = gemma_embed_cmd(
        "images", images, "--model", MODEL, "-o", out, "--flush-every", "1", "--max-soft-tokens", "70"
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 1, stderr
    assert "No space left on device" in stderr and "--resume" in stderr and "Traceback" not in stderr
    assert not out.exists()
    leftovers = [p for p in small_tmpfs.rglob("*") if p.name.endswith((".tmp", ".probe"))]
    assert leftovers == []
    parts = sorted((small_tmpfs / "out.safetensors.parts").glob("part-*.safetensors"))
    for part in parts:  # every part that exists is whole
        assert len(gemma_embed.read_metadata(part)["keys"]) == 1


def test_unwritable_output_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    ):
        prefix = []
        cleanup = ["umount", str(folder)]
    else:
        folder.chmod(0o555)
        prefix, cleanup = without_root_privilege(), None
    try:
        proc = gemma_embed_cmd(
            "images",
            ROOT / "samples" / "media" / "images",
            "--model",
            MODEL,
            "-o",
            folder / "out.safetensors",
            prefix=prefix,
        )
        assert proc.returncode == 2
        assert b"cannot write the output here" in proc.stderr
    finally:
        if cleanup:
            subprocess.run(cleanup, check=False)


def test_full_disk_in_process(tmp_path, monkeypatch):
    """The same guarantee without a real small disk: the second part write fails with ENOSPC."""
    import errno

    from helpers import run_images

    from gemma_embed.errors import RunError
    from gemma_embed.store import tensors_file

    images = _images(tmp_path / "images", 6)
    real_write = tensors_file.write_embedding_file
    calls = []

    def failing_write(path, *args, **kwargs):
        calls.append(path)
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(tensors_file, "write_embedding_file", failing_write)
    out = tmp_path / "o.safetensors"
    with pytest.raises(RunError, match="No space left on device"):
        run_images([images], MODEL, out, max_soft_tokens=70, flush_every=2)
    assert not out.exists()
    (part,) = (tmp_path / "o.safetensors.parts").glob("part-*.safetensors")
    assert len(gemma_embed.read_metadata(part)["keys"]) == 2


def test_resume_into_a_sharded_output(tmp_path):
    from helpers import run_images

    images = _images(tmp_path / "images", 5)
    out = tmp_path / "out.safetensors"
    assert run_images([images], MODEL, out, max_soft_tokens=70, shard_size=2)[0] == 0
    assert not out.exists() and (tmp_path / "out.index.json").exists()
    write_image(images / "img05.png", 30, 90, 97)
    code, records, _ = run_images([images], MODEL, out, max_soft_tokens=70, shard_size=2, resume=True, overwrite=False)
    assert code == 0 and [r["status"] for r in records if r["type"] == "item"].count("resumed") == 5
    fresh = tmp_path / "fresh.safetensors"
    assert run_images([images], MODEL, fresh, max_soft_tokens=70)[0] == 0
    ra, rb = gemma_embed.load(out), gemma_embed.load(fresh)
    assert list(ra) == list(rb) and all(torch.equal(ra[k], rb[k]) for k in ra)
    assert sorted(p.name for p in tmp_path.glob("out*")) == [
        "out-00000.safetensors",
        "out-00001.safetensors",
        "out-00002.safetensors",
        "out.index.json",
    ]


def test_closing_the_terminal_saves_the_work_and_resumes_to_the_same_bytes(tmp_path, twelve_images):
    """The run's terminal really closes: the run is a session leader on a pseudo-terminal, and the test closes the
    terminal's other end. The kernel hangs the terminal up (SIGHUP to the run; its writes to the terminal fail with
    EIO from then on): the run saves its parts, exits 129 and leaves no lock; --resume gives the uninterrupted
    output."""
    import fcntl
    import pty
    import termios

    from helpers import run_images

    images, reference = twelve_images
    out = tmp_path / "out.safetensors"
    args = [sys.executable, str(SLOW_EXE), "--encode", "0.4", "images", str(images), "--model", str(MODEL)]
    args += ["-o", str(out), "--flush-every", "2", "--batch-size", "1", "--max-soft-tokens", "70"]
    leader, follower = pty.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(follower, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        args, stdin=follower, stdout=follower, stderr=follower, preexec_fn=controlling_terminal, close_fds=True
    )
    os.close(follower)
    parts = out.with_name(out.name + ".parts")
    try:
        deadline = time.monotonic() + 120  # guards against a hang only
        while len(list(parts.glob("part-*.safetensors"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no parts were flushed"
            _drain(leader)
        os.close(leader)  # the terminal hangs up
        leader = -1
        assert proc.wait(timeout=120) == 128 + signal.SIGHUP
    finally:
        if leader >= 0:
            os.close(leader)
        if proc.poll() is None:
            proc.kill()
    assert not out.exists() and not out.with_name("out.lock").exists()
    saved = sum(len(gemma_embed.read_metadata(p)["keys"]) for p in parts.glob("part-*.safetensors"))
    assert 2 <= saved < 12
    code, _, err = run_images([images], MODEL, out, max_soft_tokens=70, resume=True, overwrite=False)
    assert code == 0, err
    _same_output(out, reference)


def _drain(fd: int) -> None:
    """Read what the run wrote to its terminal, waiting at most a moment for it (a full pty would block it)."""
    import select

    ready, _, _ = select.select([fd], [], [], 0.05)
    if ready:
        try:
            os.read(fd, 1 << 16)
        except OSError:
            pass
