"""Where the test suite's CPU goes, by kind of process and by test: the instrument for issue 30's "whole suite
under 5 minutes on 2 cores", where the suite is bound by CPU (both cores busy 92-95% of the run).

    python -m bench.suite_cpu [--every 0.5] [--top 25] [-- PYTEST ARGUMENTS]

Runs `python -m pytest` (by default the README's `-q -n 2 --dist loadfile`) and reads /proc beside it every
`--every` seconds: each process that started after the suite did, its user and system CPU seconds when last seen,
its command line, its parent and the test it was started for (PYTEST_CURRENT_TEST in its environment as it
started). `time` and pytest's own accounting miss what is not a child of pytest (Ray's daemons and workers are
the cluster's); reading /proc misses only processes that live less than one interval, and the header says how
much of the machine's busy time (/proc/stat) the processes seen account for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench import ROOT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DEFAULT_PYTEST = ["-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"]


@dataclass
class Seen:
    """One process as last read: CPU seconds (user, system), command line, parent, the test it started for."""

    pid: int
    parent: int
    user: float
    system: float
    argv: str
    test: str

    @property
    def cpu(self) -> float:
        return self.user + self.system


def kind(process: Seen, servers: set[int]) -> str:
    """What the process is, from its command line and parent (`servers`: the tests' warm command servers)."""
    argv = process.argv
    if "warm_cli.py" in argv:
        return "command forked by the warm server" if process.parent in servers else "warm command server"
    if "exec(eval(sys.stdin.readline()))" in argv:
        return "pytest worker (tests in process)"
    if argv.startswith("ray::") or "default_worker.py" in argv:
        return "Ray workers (tasks, actors)"
    if "site-packages/ray/" in argv:
        return "Ray daemons (GCS, raylet, agents)"
    if " -m pytest" in argv:
        return "pytest controller"
    if "/gemma-embed-tests-" in argv:  # tests/warm_cli.py's launcher: the caller of a forked command
        return "launcher of a forked command"
    if "gemma-embed" in argv or "gemma_embed" in argv or "torchrun" in argv:
        return "command, real start"
    if "chromium" in argv:
        return "browser"
    return "other processes (python -c helpers, ...)"


def file_of(process: Seen) -> str:
    """The test file the process was started for ("-" when it started outside a test)."""
    return process.test.split("::")[0] if process.test else "-"


def totals(processes: list[Seen]) -> tuple[Counter, Counter, Counter]:
    """CPU seconds by kind, the process count by kind, and CPU seconds by (test file, kind)."""
    argv = {p.pid: p.argv for p in processes}
    # A server's parent is a pytest worker; the commands it forks have the server as their parent and its argv.
    servers = {p.pid for p in processes if "warm_cli.py" in p.argv and "warm_cli.py" not in argv.get(p.parent, "")}
    by_kind, count, by_file = Counter(), Counter(), Counter()
    for process in processes:
        name = kind(process, servers)
        by_kind[name] += process.cpu
        count[name] += 1
        by_file[(file_of(process), name)] += process.cpu
    return by_kind, count, by_file


def _read(pid: int) -> tuple[int, int, float, float] | None:
    """(start tick, parent, user s, system s) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[19]), int(fields[1]), int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def _describe(pid: int) -> tuple[str, str]:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "", ""
    test = next(
        (v.split(b"=", 1)[1].decode(errors="replace") for v in environ if v.startswith(b"PYTEST_CURRENT_TEST=")), ""
    )
    return argv, test


def _machine() -> tuple[int, int, int]:
    """(user, system, idle) ticks of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[0] + values[1], values[2] + values[5] + values[6], values[3] + values[4]


def _start_tick(pid: int) -> int:
    read = _read(pid)
    return read[0] if read else 0


def sample(command: list[str], every: float) -> tuple[list[Seen], float, tuple[int, int, int], int]:
    """Run `command`, reading /proc every `every` s until it ends: the processes that started after it did, its
    wall seconds, the machine's (user, system, idle) ticks over the run, and its exit code."""
    before, began = _machine(), time.monotonic()
    suite = subprocess.Popen(command, cwd=ROOT)
    first_tick = _start_tick(suite.pid)
    seen: dict[tuple[int, int], Seen] = {}
    while True:
        ended = suite.poll() is not None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            read = _read(int(entry))
            if read is None or read[0] < first_tick or int(entry) == os.getpid():
                continue
            start, parent, user, system = read
            key = (int(entry), start)
            if key in seen:
                seen[key].user, seen[key].system = user, system
            else:
                argv, test = _describe(int(entry))
                seen[key] = Seen(int(entry), parent, user, system, argv, test)
        if ended:
            break
        time.sleep(every)
    after = _machine()
    return (
        list(seen.values()),
        time.monotonic() - began,
        tuple(a - b for a, b in zip(after, before, strict=True)),
        suite.returncode,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between readings of /proc")
    parser.add_argument("--top", type=int, default=25, help="rows of the by-file table")
    parser.add_argument("--save", type=Path, help="also write what was read to this JSON file")
    parser.add_argument("--load", type=Path, help="report a run saved with --save instead of running the suite")
    parser.add_argument("pytest", nargs="*", help="pytest's arguments (after --)")
    args = parser.parse_args()
    command = [sys.executable, "-m", "pytest", *(args.pytest or DEFAULT_PYTEST)]
    if args.load:
        saved = json.loads(args.load.read_text())
        processes = [Seen(**p) for p in saved["processes"]]
        command, wall, (user, system, idle), code = saved["command"], saved["wall"], saved["machine"], saved["code"]
    else:
        processes, wall, (user, system, idle), code = sample(command, args.every)
    if args.save:
        machine = [user, system, idle]
        record = {"command": command, "wall": wall, "machine": machine, "code": code}
        args.save.write_text(json.dumps({**record, "processes": [dataclasses.asdict(p) for p in processes]}))
    from bench.common import cpu_name

    busy = (user + system) / CLOCK_TICKS
    seen = sum(p.cpu for p in processes)
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs; {' '.join(command[1:])} -> exit {code}")
    print(
        f"# wall {wall:.0f} s; the machine busy {busy:.0f} core-s ({busy / (wall * os.cpu_count()):.0%} of its "
        f"cores; system {system / CLOCK_TICKS:.0f} core-s), idle {idle / CLOCK_TICKS:.0f} core-s; "
        f"{len(processes)} processes seen, {seen:.0f} core-s ({seen / busy:.0%} of the busy time)"
    )
    by_kind, count, by_file = totals(processes)
    print(f"{'core-s':>8} {'share':>6} {'procs':>6}  kind")
    for name, cpu in by_kind.most_common():
        print(f"{cpu:8.1f} {cpu / seen:6.1%} {count[name]:6d}  {name}")
    print(f"\n{'core-s':>8}  test file (the test a process started for) / kind")
    for (file, name), cpu in by_file.most_common(args.top):
        print(f"{cpu:8.1f}  {file} / {name}")


if __name__ == "__main__":
    main()
