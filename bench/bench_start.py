"""A command's fixed cost from a new process (issue 34, goal 3): each command on the shipped samples, each run a
fresh interpreter, against `python -c "import torch"` measured in the same rounds.

    python -m bench.bench_start [--rounds 3] [--against DIR] [--busy]

Cases: `import torch`; `--help`; `models`; `inspect OUT`; a one-off text query (`search OUT "a red car"`) against
an EmbeddingGemma 2 output and against an EmbeddingGemma output; `text` (EmbeddingGemma, 3 lines) and `images`
(the tiny Gemma 4, the 7 sample images) into a new output. Per run: wall seconds, CPU seconds (user + system, the
child's own rusage) and, for commands that load a model, when the first line reached the terminal (stderr is a
pseudo-terminal, as a person's is: the `loading MODEL ...` status line). Sides (this checkout and `--against`, run
by PYTHONPATH, so each side's own code) and cases alternate in every round; medians over the rounds.
`--busy`: one `python -c "while True: pass"` beside the runs, killed at the end.
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT
from bench.common import cpu_name

SAMPLES = ROOT / "samples"
MAIN = "import sys; from gemma_embed.cli import main; sys.argv[0] = 'gemma-embed'; main()"


def timed(argv: list[str], pythonpath: Path, cwd: Path) -> dict:
    """One fresh process: wall and CPU seconds, and when its first stderr line arrived on a pseudo-terminal."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "COLUMNS": "120"}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    os.close(slave)
    first_line, seen = None, b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed its end
                chunk = b""
            if not chunk:
                break
            seen += chunk
            if first_line is None and b"\n" in seen:
                first_line = time.perf_counter() - start
        elif proc.poll() is not None:
            break
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    os.close(master)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv[-6:])} exited {code}: {seen.decode(errors='replace')[-1500:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "first_line": first_line}


def cases(folder: Path) -> dict[str, list[str]]:
    lines = folder / "lines.txt"
    tool = [sys.executable, "-c", MAIN]
    return {
        "import torch": [sys.executable, "-c", "import torch"],
        "--help": [*tool, "--help"],
        "models": [*tool, "models"],
        "inspect": [*tool, "inspect", str(folder / "eg2.safetensors")],
        "search (EmbeddingGemma 2)": [*tool, "search", str(folder / "eg2.safetensors"), "a red car"],
        "search (EmbeddingGemma)": [*tool, "search", str(folder / "eg1.safetensors"), "a red car"],
        "text (EmbeddingGemma)": [
            *tool,
            "text",
            str(lines),
            "--model",
            str(SAMPLES / "tiny-embeddinggemma"),
            "-o",
            str(folder / "new-text.safetensors"),
            "--overwrite",
        ],  # fmt: skip
        "images (Gemma 4)": [
            *tool,
            "images",
            str(SAMPLES / "media" / "images"),
            "--model",
            str(SAMPLES / "tiny-gemma4"),
            "-o",
            str(folder / "new-images.safetensors"),
            "--overwrite",
        ],  # fmt: skip
    }


def outputs(folder: Path) -> None:
    """The outputs the search and inspect cases read, written once by this checkout's command."""
    lines = folder / "lines.txt"
    lines.write_text("a red car\nthe sea at dawn\nsnow on the mountains\n")
    for name, model in (("eg2", "tiny-embeddinggemma2"), ("eg1", "tiny-embeddinggemma")):
        subprocess.run(
            [sys.executable, "-c", MAIN, "text", str(lines), "--model", str(SAMPLES / model), "-o",
             str(folder / f"{name}.safetensors"), "-q"],
            check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, run alternately with this one")
    parser.add_argument("--busy", action="store_true", help="one busy process beside the runs")
    parser.add_argument("--only", help="comma-separated case names to run (default: all)")
    args = parser.parse_args()
    sides = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs; {args.rounds} rounds; busy process beside: {args.busy}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            outputs(folder)
            table = cases(folder)
            if args.only:
                table = {name: argv for name, argv in table.items() if name in args.only.split(",")}
            results: dict[tuple[str, str], list[dict]] = {}
            for round_index in range(args.rounds):
                order = list(sides.items())
                if round_index % 2:
                    order.reverse()
                for name, argv in table.items():
                    for side, root in order:
                        results.setdefault((name, side), []).append(timed(argv, root, folder))
            torch_wall = {
                side: statistics.median(r["wall"] for r in results[("import torch", side)])
                for side in sides
                if ("import torch", side) in results
            }
            print("| case | side | wall s | CPU s | - import torch s | first stderr line s |")
            print("|---|---|---|---|---|---|")
            for (name, side), runs in results.items():
                wall = statistics.median(r["wall"] for r in runs)
                cpu = statistics.median(r["cpu"] for r in runs)
                firsts = [r["first_line"] for r in runs if r["first_line"] is not None]
                first = f"{statistics.median(firsts):.2f}" if firsts else "-"
                over = f"{wall - torch_wall[side]:+.2f}" if side in torch_wall else "-"
                print(f"| {name} | {side} | {wall:.2f} | {cpu:.2f} | {over} | {first} |")
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    main()
