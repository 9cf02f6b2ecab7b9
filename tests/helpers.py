"""Helpers the tests import: paths, real image files, transformers' per-item reference, and running the library
the way the CLI does. torch and the package's runner are imported inside the helpers that need them, so a test
file of pure functions does not pay for them."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import warm_cli

ROOT = Path(__file__).resolve().parents[1]
# The command line run as a subprocess imports this checkout's package (a worktree's, not the editable install's);
# in-process, pytest's `pythonpath` setting (pyproject.toml) puts the checkout and samples/ first.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

SAMPLE_MODEL = ROOT / "samples" / "tiny-gemma4"
TEST_MEDIA = ROOT / "tests" / "media"  # real media other projects made (tests/media/SOURCES.md)
# The installed console script, a new process for each run: for tests of a new process itself (its start, its
# imports, its peak RSS against a fixed bound).
REAL_EXE = shutil.which("gemma-embed") or str(Path(sys.executable).parent / "gemma-embed")
# The same command forked from a server that has imported it (tests/warm_cli.py: 4.5 s of imports saved a run);
# without the server, or for a run whose start it cannot reproduce, it is REAL_EXE.
EXE = warm_cli.launcher(ROOT / "tests")
os.environ[warm_cli.REAL_VARIABLE] = REAL_EXE
SLOW_EXE = ROOT / "tests" / "slow_gemma_embed.py"  # the real CLI with a delay before each encode (its docstring)
# SLOW_EXE forked from the same warm server (`python SLOW_EXE` without it): for runs stopped by a signal it passes
# on, or by a SIGKILL sent to the PID in the command's report (warm_cli.REPORT_VARIABLE).
SLOW_CLI = warm_cli.launcher(ROOT / "tests", SLOW_EXE)
# `python SCRIPT ...` with SCRIPT forked from the same server: Ray's `py_executable` for the tests' clusters.
PYTHON_CLI = warm_cli.python_launcher(ROOT / "tests")

# A wrapper whose only child is the gemma-embed command (EXE): the command's peak RSS is its report's (a command
# forked from the warm server: its own VmHWM) or else RUSAGE_CHILDREN's ru_maxrss (a real start: that command's).
PEAK_RSS_WRAPPER = textwrap.dedent(f"""
    import json, os, resource, subprocess, sys, tempfile
    listing, args = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as folder, open(listing, "rb") as stdin:
        path = os.path.join(folder, "report.json")
        env = {{**os.environ, {warm_cli.REPORT_VARIABLE!r}: path}}
        proc = subprocess.run(args, stdin=stdin, capture_output=True, text=True, env=env)
        report = json.loads(open(path).read()) if os.path.exists(path) else {{}}
    peak = report.get("peak") or resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({{"code": proc.returncode, "peak": peak, "stdout": proc.stdout, "stderr": proc.stderr[-2000:]}}))
""")

# The command line in a child Python that says, when it exits, what it did on the way: whether it imported torch
# or transformers (a command that fails "at once" fails before them; on a busy machine their import alone takes
# seconds) and every address it tried to connect to. The report goes to a file of its own, so the command's
# stdout and stderr stay exactly its own.
REPORTING_CLI = textwrap.dedent("""
    import atexit, json, socket, sys
    report, argv = sys.argv[1], sys.argv[2:]
    connects = []
    real_connect = socket.socket.connect
    def connect(self, address):
        connects.append(list(address) if isinstance(address, tuple) else address)
        return real_connect(self, address)
    socket.socket.connect = connect
    def write():
        imported = [name for name in ("torch", "transformers") if sys.modules.get(name) is not None]
        with open(report, "w") as out:
            json.dump({"imported": imported, "connects": connects}, out)
    atexit.register(write)
    from gemma_embed.cli import main
    sys.argv = ["gemma-embed", *argv]
    main()
""")


def reporting_cli(*args, env: dict | None = None, timeout: float = 120):
    """`gemma-embed ARGS` (REPORTING_CLI): its CompletedProcess (text) and its report, {"imported": [...],
    "connects": [[host, port], ...]}."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:  # not beside the output: tests check what the run left there
        report = Path(folder) / "report.json"
        proc = subprocess.run(
            [sys.executable, "-c", REPORTING_CLI, str(report), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        assert report.exists(), proc.stderr
        return proc, json.loads(report.read_text())


# Six aspect ratios, including the two extremes the issue names (1x1 and 4000x300).
IMAGE_SIZES = {
    "one.png": (1, 1),
    "wide.jpg": (4000, 300),
    "landscape.jpg": (640, 480),
    "portrait.png": (480, 640),
    "square.png": (512, 512),
    "tall.webp": (200, 1400),
    "landscape2.jpg": (1280, 960),
}


def write_image(path: Path, width: int, height: int, seed: int) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([np.sin(x / 17.0 + seed), np.cos(y / 11.0), np.sin((x + y) / 23.0)], -1)
    noise = rng.normal(0, 0.15, (height, width, 3))
    pixels = ((base * 0.4 + 0.5 + noise).clip(0, 1) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))
    return path


def reference_image_rows(model, processor, path: Path, max_soft_tokens: int, space: str = "language"):
    """transformers' own per-item path: the processor on this one image, then get_image_features."""
    import torch
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        image = ImageOps.exif_transpose(img).convert("RGB")
    inputs = processor([image], return_tensors="pt", max_soft_tokens=max_soft_tokens)
    with torch.no_grad():
        out = model.get_image_features(
            pixel_values=inputs["pixel_values"], image_position_ids=inputs["image_position_ids"]
        )
    if space == "tower":
        return out.last_hidden_state
    (rows,) = out.pooler_output
    return rows


_reference_cache: dict = {}


def reference_video_rows(model, processor, path, item_meta: dict, space: str = "language"):
    """transformers' own per-video path on the frames the tool reports: its PyAV reader at those indices, the
    rotation the tool reports (transformers' reader ignores it), the video processor, get_video_features."""
    import numpy as np
    import torch
    from transformers.video_utils import read_video_pyav

    key = (str(path), tuple(item_meta["frame_indices"]), item_meta["rotation"], space)
    if key not in _reference_cache:
        indices = np.array(item_meta["frame_indices"])
        frames, _ = read_video_pyav(str(path), sample_indices_fn=lambda **_: indices)
        frames = np.ascontiguousarray(np.rot90(frames, k=item_meta["rotation"] // 90, axes=(1, 2)))
        inputs = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        with torch.no_grad():
            out = model.model.get_video_features(
                pixel_values_videos=inputs["pixel_values_videos"],
                video_position_ids=inputs["video_position_ids"],
                num_frames_per_video=inputs["num_frames_per_video"],
            )
        _reference_cache[key] = out.last_hidden_state if space == "tower" else out.pooler_output[0]
    return _reference_cache[key]


def items_by_key(path) -> dict[str, dict]:
    """An output's item metadata by key."""
    import gemma_embed

    meta = gemma_embed.read_metadata(path)
    return dict(
        zip(json.loads(meta["keys"]) if isinstance(meta["keys"], str) else meta["keys"], meta["items"], strict=True)
    )


def rel_error(ours, ref) -> float:
    return float((ours.float() - ref.float()).norm() / ref.float().norm())


def run_images(inputs, model: Path, output: Path, stdin=None, **options) -> tuple[int, list[dict], str]:
    """Run the pipeline as the CLI does; return (exit code, stdout JSON records, stderr text)."""
    from gemma_embed.cli import exit_code
    from gemma_embed.config import RunConfig
    from gemma_embed.pipeline import run
    from gemma_embed.progress import Reporter

    options.setdefault("overwrite", not options.get("resume", False))  # the two contradict each other
    options.setdefault("device", "cpu")
    config = RunConfig(
        modality=options.pop("modality", "images"),
        inputs=tuple(str(i) for i in inputs),
        output=output,
        model=str(model),
        **options,
    )
    out, err = io.StringIO(), io.StringIO()
    result = run(config, Reporter(jsonl=True, stdout=out, stderr=err, live=False), stdin=stdin, own_process=True)
    records = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return exit_code(result), records, err.getvalue()


def record_batches(monkeypatch, tower_cls) -> list[list]:
    """Spy on a tower: the list of units of every device batch it runs (the batch still runs)."""
    batches: list[list] = []
    original = tower_cls.encode

    def spy(self, units, space):
        batches.append(list(units))
        return original(self, units, space)

    monkeypatch.setattr(tower_cls, "encode", spy)
    return batches


def record_outputs(monkeypatch, tower_cls) -> list[tuple[list, object]]:
    """Spy on a tower: (units, rows on the host) of every device batch it runs."""
    calls: list[tuple[list, object]] = []
    original = tower_cls.encode

    def spy(self, units, space):
        rows = original(self, units, space)
        calls.append((list(units), rows.cpu()))
        return rows

    monkeypatch.setattr(tower_cls, "encode", spy)
    return calls


def fail_chunks_above(monkeypatch, tower_cls, limit: int) -> None:
    """A test double for a device that runs out of memory on any chunk of more than `limit` units."""
    import torch

    original = tower_cls.encode

    def limited(self, units, space):
        if len(units) > limit:
            raise torch.OutOfMemoryError(f"injected out-of-memory for a chunk of {len(units)}")
        return original(self, units, space)

    monkeypatch.setattr(tower_cls, "encode", limited)


def spy_tensor_reads(monkeypatch) -> list[str]:
    """Every tensor key read through safetensors.safe_open from now on, in order."""
    import safetensors

    keys: list[str] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def get_tensor(self, key):
            keys.append(key)
            return self.handle.get_tensor(key)

        def __getattr__(self, name):
            return getattr(self.handle, name)

    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: Spy(real_open(*a, **k)))
    return keys


def summary(stdout: str) -> dict:
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert records and records[-1]["type"] == "summary"
    return records[-1]


def invoke(*args):
    """The command in-process (typer's CliRunner), arguments as strings, exceptions raised."""
    from typer.testing import CliRunner

    from gemma_embed.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


GIB = 2**30


class FakeTower:
    """A tower with no weights (the `models.base.Tower` interface) for engine and batching tests.

    Each unit's rows are `width` copies of its length, so a test can tell whose rows it got; a unit costs
    `cost_per_length` bytes per unit of length; `calls` keeps the units of every `encode`. Given `device_memory` (an
    object whose `allocate(bytes)` returns a block that lives as long as it is referenced, like a fake CUDA
    device's), a forward really needs `actual` times its modelled cost, allocated in two halves as activations pile
    up, and the first call also keeps a `workspace` allocated for good.
    """

    def __init__(
        self,
        grouping: str = "exact",
        width: int = 4,
        cost_per_length: int = GIB,
        device_memory=None,
        actual: float = 1.0,
        workspace: int = 0,
    ):
        import torch

        self.grouping, self.width, self.cost_per_length = grouping, width, cost_per_length
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.device_memory, self.actual, self.workspace = device_memory, actual, workspace
        self.calls: list[list] = []
        self.kept: list = []  # allocations that outlive a chunk (a first call's workspace)

    def unit_cost(self, length: int) -> int:
        return length * self.cost_per_length

    def encode(self, units, space):
        import torch

        self.calls.append(list(units))
        if self.device_memory is not None:
            if self.workspace and not self.kept:
                self.kept.append(self.device_memory.allocate(self.workspace))
            need = int(self.actual * sum(self.unit_cost(u.length) for u in units))
            first_half = self.device_memory.allocate(need // 2)  # noqa: F841 - alive in this frame, as activations are
            second_half = self.device_memory.allocate(need - need // 2)  # noqa: F841
        return torch.cat([torch.full((u.rows, self.width), float(u.length)) for u in units])


def start_ray():
    """A local Ray cluster for a test module (2 CPUs, no dashboard, the workers' output kept in Ray's logs), joined
    by this process; returns ray.init's context. Its workers (`python default_worker.py ...`) are forked from this
    process's warm server (PYTHON_CLI as Ray's `py_executable`), which has imported torch, transformers and the
    package: an encode actor on the tiny samples then takes 1.9 s of CPU instead of 7, on this project's 2-core
    EPYC. Without the server (GEMMA_EMBED_TEST_NO_WARM_CLI), each worker starts anew."""
    import logging

    import ray

    from gemma_embed.ray_data import _signal_handlers_kept

    runtime_env = {"py_executable": PYTHON_CLI} if os.environ.get(warm_cli.SOCKET_VARIABLE) else None
    with _signal_handlers_kept():  # ray.init sets SIGTERM's: later tests (and this process) keep their own
        return ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            runtime_env=runtime_env,
        )


def on_a_terminal(args, cwd, stderr_too: bool = False) -> tuple[int, bytes]:
    """The command with its stdout on a pseudo-terminal, as a person runs it (and its stderr too with
    `stderr_too`, else a pipe): its exit code and what reached the terminal."""
    import pty
    import select
    import subprocess

    leader, follower = pty.openpty()
    stderr = follower if stderr_too else subprocess.PIPE
    proc = subprocess.Popen([EXE, *map(str, args)], cwd=cwd, stdout=follower, stderr=stderr)
    os.close(follower)
    shown = b""
    while select.select([leader], [], [], 120)[0]:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the command closed the terminal's other side
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    proc.communicate(timeout=120)
    return proc.returncode, shown
