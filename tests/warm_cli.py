"""The command line for the tests, forked from a process that has already imported it.

Why: a `gemma-embed` process spends about 4.5 s of CPU importing torch and transformers before it reads its
first argument (a run on the tiny samples takes 5.8 s, of which the work is under a second, on this project's
2-core EPYC). The suite started about 175 such processes: 560 s of the 842 s of CPU time its processes used.
Here each pytest process starts one server that imports the package, torch and transformers once; the tests'
`EXE` (a launcher running `client`) asks it for a run, and the server forks a child that becomes the command:
it takes the caller's stdin, stdout and stderr (passed over a Unix socket), working folder, umask and
environment, and runs `gemma_embed.cli.main()` as the console script does. The caller is a real process the
test drives as before: its exit code or signal is the command's, and the signals a test sends it (SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2) are passed on to the command. If the caller dies (SIGKILL), the command
kills itself at once. tests/cli/test_warm_cli.py checks each of these against the installed command.

What a forked child cannot give is the start of a new process, so those runs are a real `exec` of the installed
command (the server's log names the reason): an environment that differs in anything read at import time (all
but `RUNTIME_VARIABLES`), other resource limits, capabilities beyond the server's, or no server. A module whose runs
all share such an environment (tokens, HOME, HF_ENDPOINT, torchrun's OMP_NUM_THREADS) starts a server of its own in
it (`environment_with_server`: tests/cli/test_remote_secrets.py, tests/cli/test_hub_inputs.py,
tests/cli/test_distributed.py's ranks). Fewer capabilities than the server's
(`setpriv --bounding-set=-dac_override` before a run drops root's) are the caller's in the forked child: it drops
the rest before anything else runs (`_take_capabilities`).

A caller that names a file in REPORT_VARIABLE learns the command's PID (its /proc entry) and, from a forked
command, its own peak RSS as it ends: tests that compare a command's peak RSS with itself or another forked run
(flat in the input's size, growth above the loaded process) and the server tests (their RSS, their sockets) read
it. A fork holds fewer of the libraries' pages than a real start (556 against 875 MiB at the peak of a run on the
sample images), so a peak held against a fixed bound and the imports are a real start's (`REAL_EXE`,
`python SLOW_EXE`, `python -c`); tests/cli/test_start_up_imports.py checks the real start. The PID in a lock file
and what a SIGKILL leaves are the forked command's own: the test reads the PID from the report and signals it.
`SLOW_CLI` is the same launcher for tests/slow_gemma_embed.py (the CLI slowed or gated at chosen stages), run as
`__main__` in the forked child: the runs a test stops with a signal it passes on (SIGINT, SIGHUP, SIGQUIT, SIGTERM)
or sends SIGKILL, and torchrun's ranks, use it. `python_launcher` is `python SCRIPT ...` forked, Ray's
`py_executable` for the tests' clusters (helpers.start_ray): their workers start with torch and transformers
imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

SOCKET_VARIABLE = "GEMMA_EMBED_TEST_CLI_SOCKET"
REAL_VARIABLE = "GEMMA_EMBED_TEST_REAL_CLI"
NO_SERVER_VARIABLE = "GEMMA_EMBED_TEST_NO_WARM_CLI"  # set: no server, every run of EXE a real start
# A file the command's process reports itself in, for tests that watch that process (its /proc entry, its peak
# RSS) whether it was forked or started anew: {"pid"} once it exists, {"pid", "peak"} (its VmHWM, bytes) when a
# forked command ends. A real start reports only its PID (the launcher's, which exec keeps); its peak is what
# the kernel gives its parent (RUSAGE_CHILDREN), where a forked command's would start from the server's.
REPORT_VARIABLE = "GEMMA_EMBED_TEST_CHILD_REPORT"
# Read by the command (or the libraries it calls) when it runs, not when it is imported: they may differ between
# the server's environment and the caller's.
# (Ray's client sets RAY_* and PYTHONBREAKPOINT in the pytest process once a test starts a cluster; the server
# imports no Ray, and the command reads them when it starts one.)
# (SPT_NOENV is setproctitle's, which Ray's worker imports and reads it with, after the fork. What torchrun gives
# each rank is read when a process group or the slice is made: by torch.distributed, transformers' distributed
# helpers and gemma_embed.distributed, in functions; SLOW_RANK and SHORT_PG_TIMEOUT_S by tests/slow_gemma_embed.py
# when it runs.)
RUNTIME_VARIABLES = (
    "COLUMNS", "LINES", "TERM", "NO_COLOR", "FORCE_COLOR", "PWD", "OLDPWD", "_", "PYTHONUNBUFFERED",
    "PYTHONBREAKPOINT", "SPT_NOENV", SOCKET_VARIABLE,
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "SLOW_RANK", "SHORT_PG_TIMEOUT_S",
)  # fmt: skip
RUNTIME_PREFIXES = ("PYTEST_", "GEMMA_EMBED_", "AWS_", "TORCHINDUCTOR_", "RAY_", "TORCHELASTIC_")
# Lists of folders searched in order, where a folder named again is never searched again: compared as the folders
# they name, each once. Each process that starts through pyenv's shim puts its folders in front again, so Ray's
# workers (started by daemons that started through it) have PATH and PYENV_HOOK_PATH longer than the server's,
# naming the same folders in the same order; an xdist worker inherits the PYTHONPATH tests/helpers.py set in the
# controller and sets it again.
SEARCH_PATHS = ("PATH", "PYENV_HOOK_PATH", "PYTHONPATH")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PRELOADED = (
    "torch",
    "transformers.modeling_utils",
    "transformers.processing_utils",
    "gemma_embed.cli",
    "gemma_embed.pipeline",
    "gemma_embed.models.gemma4",
    "gemma_embed.models.gemma3",
    "gemma_embed.models.gemma3n",
    "gemma_embed.models.embeddinggemma",
    "gemma_embed.models.embeddinggemma2",
    "gemma_embed.media.image",
    "gemma_embed.media.video",
    "gemma_embed.media.audio",
)
LIMITS = tuple(getattr(__import__("resource"), name) for name in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE"))


def _import_time_environment(env: dict[str, str]) -> dict[str, str]:
    kept = {k: v for k, v in env.items() if k not in RUNTIME_VARIABLES and not k.startswith(RUNTIME_PREFIXES)}
    for name in SEARCH_PATHS:
        if name in kept:
            kept[name] = os.pathsep.join(dict.fromkeys(kept[name].split(os.pathsep)))
    return kept


def _limits() -> list:
    """What the kernel lets this process do, which a forked child would take from the server instead: resource
    limits and capabilities ({"CapInh": bits, "CapPrm", "CapEff", "CapBnd", "CapAmb"}, from /proc/self/status)."""
    import resource

    with open("/proc/self/status") as status:
        capabilities = {
            name: int(value, 16) for name, value in (line.split(":") for line in status if line.startswith("Cap"))
        }
    return [[list(resource.getrlimit(limit)) for limit in LIMITS], capabilities]


def _fewer_capabilities(theirs: dict[str, int], ours: dict[str, int]) -> bool:
    """Whether a child of ours can hold the caller's capabilities: each of its sets within ours (a process may
    drop capabilities, never gain them), and the same ambient set."""
    return (
        theirs.keys() == ours.keys()
        and theirs.get("CapAmb") == ours.get("CapAmb")
        and all(theirs[k] & ~ours[k] == 0 for k in ours if k != "CapAmb")
    )


def _take_capabilities(wanted: dict[str, int], ours: dict[str, int]) -> None:
    """In the forked child, while it has one thread (capabilities are each thread's; later threads inherit them):
    the caller's bounding set (prctl PR_CAPBSET_DROP of each capability it lacks), then its effective, permitted
    and inheritable sets (capset, version 3: two 32-bit words each). As setpriv's exec of the command left them."""
    import ctypes

    if ours == wanted:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, version_3 = 24, 0x20080522
    for bit in range(64):
        if ours["CapBnd"] >> bit & 1 and not wanted["CapBnd"] >> bit & 1 and libc.prctl(pr_capbset_drop, bit, 0, 0, 0):
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {bit})")
    header = (ctypes.c_uint32 * 2)(version_3, 0)
    data = (ctypes.c_uint32 * 6)()
    for word in range(2):
        for place, name in enumerate(("CapEff", "CapPrm", "CapInh")):
            data[3 * word + place] = wanted[name] >> (32 * word) & 0xFFFFFFFF
    if libc.capset(header, data):
        raise OSError(ctypes.get_errno(), "capset")
    taken = _limits()[1]
    if taken != wanted:
        raise OSError(f"capabilities {taken} after capset, not the caller's {wanted}")


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _receive(reader) -> dict | None:
    line = reader.readline()
    return json.loads(line) if line else None


# ---------------------------------------------------------------------------------------------- the caller


def launcher(tests: Path, script: Path | None = None) -> str:
    """An executable `gemma-embed` that runs `client` with this interpreter, named by its absolute path (a shim
    such as pyenv's would change the environment on the way). Written once under the temporary folder. With
    `script` (tests/slow_gemma_embed.py), the forked child runs that script as `__main__` instead of the console
    script, and without the server it is `python script`."""
    body = f"client(sys.argv[1:], {str(script) if script else None!r})\n"
    return _executable(tests, Path(script).stem if script else "gemma-embed", body)


def python_launcher(tests: Path) -> str:
    """An executable that does what `python SCRIPT ARGS...` does, SCRIPT forked from the server as `__main__`
    (a real `python` for anything else, such as options before the script): Ray's `py_executable`, so the
    cluster's workers (`python .../default_worker.py ...`) start with torch and transformers imported."""
    body = (
        "if len(sys.argv) > 1 and not sys.argv[1].startswith('-'):\n"
        "    client(sys.argv[2:], sys.argv[1])\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    )
    return _executable(tests, "python", body)


def _executable(tests: Path, name: str, body: str) -> str:
    """`body` after `client`'s import, as an executable script named `name`, written once under the temporary
    folder (in a folder named by the script's hash)."""
    import hashlib
    import tempfile

    text = (
        f"#!{sys.executable}\nimport os, sys\nsys.path.insert(0, {str(tests)!r})\nfrom warm_cli import client\n{body}"
    )
    folder = Path(tempfile.gettempdir()) / f"gemma-embed-tests-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    path = folder / name
    if not path.exists():
        folder.mkdir(exist_ok=True)
        temporary = folder / f".{name}.{os.getpid()}"
        temporary.write_text(text)
        temporary.chmod(0o755)
        os.replace(temporary, path)
    return str(path)


def client(argv: list[str], script: str | None = None) -> None:
    """The launcher's body: the run through the server, else the installed command (or `python script`) itself."""
    start = [sys.executable, script] if script else [os.environ.get(REAL_VARIABLE) or "gemma-embed"]
    path = os.environ.get(SOCKET_VARIABLE)
    conn = None
    if path:
        try:
            for fd in (0, 1, 2):
                os.fstat(fd)  # a closed standard stream: the real command decides what that means
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(path)
        except OSError:
            conn = None
    if conn is None:
        _real_start(start, argv)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": os.umask(0o22), "limits": _limits()}
    request["script"] = script
    os.umask(request["umask"])
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    reader = conn.makefile("rb")
    answer = _receive(reader)
    if answer is None or "pid" not in answer:
        conn.close()
        _real_start(start, argv)
    pid = answer["pid"]

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    done = _receive(reader)
    status = done["status"] if done is not None else 9  # the server went away: as if killed
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum != signal.SIGKILL:  # whose action is the default's already, and may not be set
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


def _real_start(start: list[str], argv: list[str]) -> None:
    report(os.getpid())  # exec keeps the PID: the command's own
    os.execvp(start[0], [*start, *argv])


def report(pid: int, peak: int | None = None) -> None:
    """Write the process's report (REPORT_VARIABLE) when the caller asked for one: whole or not at all."""
    path = os.environ.get(REPORT_VARIABLE)
    if not path:
        return
    temporary = f"{path}.{os.getpid()}"
    with open(temporary, "w") as out:
        json.dump({"pid": pid} if peak is None else {"pid": pid, "peak": peak}, out)
    os.replace(temporary, path)


def reported_pid(path: Path) -> int:
    """The PID in a command's report (written before the command runs)."""
    return json.loads(Path(path).read_text())["pid"]


def peak_rss(pid: int | str = "self") -> int:
    """A live process's peak RSS so far (VmHWM), bytes; this process's by default."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


# ---------------------------------------------------------------------------------------------- the server


def listen(path: Path) -> socket.socket:
    """The server's socket, bound and listening before the server starts (`serve` is handed it): a caller from
    then on connects at once and waits in the backlog until the server has imported, never missing it; if the
    server dies, its callers' connections end and they start the command themselves."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    return listener


@contextlib.contextmanager
def warm_server(folder: Path, env: dict[str, str] | None = None) -> Iterator[Path]:
    """A server (`serve`) in its own process with `env` as its environment (this process's when None), its socket
    listening at folder/socket before it starts and its log at folder/server.log; yields the socket's path, which
    callers name in SOCKET_VARIABLE. The session has one (tests/conftest.py); a module whose runs all share an
    environment the session's server does not have (other tokens, HOME, HF_ENDPOINT: read at import) starts one
    with that environment, and its runs fork instead of starting anew. Stopped on leaving."""
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    socket_path = folder / "socket"
    with open(folder / "server.log", "wb") as log, listen(socket_path) as listener:
        server = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(listener.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(listener.fileno(),),
            env=env,
        )
    try:
        yield socket_path
    finally:
        server.terminate()
        server.wait(timeout=60)


@contextlib.contextmanager
def environment_with_server(folder: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`env` for the tests' EXE, naming a server of its own started in that environment (`warm_server`, its files
    in `folder`), so the runs a module makes in it fork; `env` alone where the session runs without servers
    (GEMMA_EMBED_TEST_NO_WARM_CLI), and the runs start anew."""
    env = {name: value for name, value in env.items() if name != SOCKET_VARIABLE}
    if os.environ.get(NO_SERVER_VARIABLE):
        yield env
        return
    with warm_server(folder, env) as socket_path:
        yield {**env, SOCKET_VARIABLE: str(socket_path)}


def serve(listening_fd: int) -> None:
    """Import what a run imports, then fork a command for each caller on the socket `listen` made."""
    import importlib
    import threading

    listener = socket.socket(fileno=listening_fd)
    # What the runs on the samples import, torch and transformers' modelling first. Nothing here computes with
    # torch: a child forked after OpenMP's threads have started would wait for threads it does not have. The
    # packages the console script keeps out of its process stay out of this one too (its `main` does this first,
    # and finds them imported otherwise), so a forked run holds the modules a real start holds.
    from gemma_embed.unused_packages import keep_out_unused_packages

    keep_out_unused_packages()
    for name in PRELOADED:
        importlib.import_module(name)
    environment = _import_time_environment(dict(os.environ))
    limits = _limits()
    while True:
        conn, _ = listener.accept()
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not message.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    break
                message += more
            request = json.loads(message)
        except (OSError, ValueError):
            conn.close()
            continue
        reason = None
        if len(fds) != 3:
            reason = "standard streams"
        elif _import_time_environment(request["env"]) != environment:
            theirs = _import_time_environment(request["env"])
            names = sorted(k for k in environment.keys() | theirs.keys() if environment.get(k) != theirs.get(k))
            reason = f"environment: {', '.join(names)}"
        elif request["limits"][0] != limits[0]:
            reason = "resource limits"
        elif not _fewer_capabilities(request["limits"][1], limits[1]):
            reason = "capabilities"
        if reason is not None:
            print(f"{request['argv'][:1]}: a real start ({reason})", flush=True)
            _send(conn, {"fallback": reason})
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            _become_the_command(request, fds, conn, limits[1])
        for fd in fds:
            os.close(fd)
        print(f"{request['argv'][:1]}: forked {pid}", flush=True)  # logged before its caller learns of it
        _send(conn, {"pid": pid})
        threading.Thread(target=_report_exit, args=(pid, conn), daemon=True).start()


def _report_exit(pid: int, conn: socket.socket) -> None:
    _, status = os.waitpid(pid, 0)
    try:
        _send(conn, {"status": status})
    except OSError:
        pass
    conn.close()


def _become_the_command(request: dict, fds: list[int], conn: socket.socket, capabilities: dict[str, int]) -> None:
    """In the forked child: the caller's capabilities (the server's are `capabilities`), streams, folder, umask and
    environment, then the console script."""
    import atexit
    import tempfile
    import threading

    code = 1
    try:
        _take_capabilities(request["limits"][1], capabilities)  # first: this is the child's only thread
        for signum in range(1, signal.NSIG):  # as a new interpreter sets them
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.pop(SOCKET_VARIABLE, None)
        tempfile.tempdir = None  # computed again from this environment's TMPDIR
        _standard_streams()
        report(os.getpid())

        def caller_gone():  # the caller died (a SIGKILL a test sent it); so does the command
            try:
                while conn.recv(1 << 10):
                    pass
            except OSError:  # a reset: the caller's end closed with the server's answer unread
                pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=caller_gone, daemon=True).start()
        script = request.get("script")
        sys.argv = [script or os.environ.get(REAL_VARIABLE) or "gemma-embed", *request["argv"]]
        if script:
            import runpy

            def main():  # as `python script`: its folder first on the path, run as __main__
                sys.path.insert(0, str(Path(script).parent))
                runpy.run_path(script, run_name="__main__")
        else:
            from gemma_embed.cli import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:
            import traceback

            traceback.print_exc()
            _flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        threading._shutdown()  # as the interpreter does at exit: wait for the threads that are not daemons
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the child must never return into the server's loop
        import traceback

        traceback.print_exc()
    code = _flush(code)
    try:
        report(os.getpid(), peak_rss())
    except OSError:
        pass
    os._exit(code)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _standard_streams() -> None:
    """sys.stdin/stdout/stderr made anew on fds 0-2, as a new interpreter makes them: stdout line-buffered on a
    terminal only, stderr always line-buffered, the same encoding and error handlers as the server's."""
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    streams = []
    for fd, mode, old in ((0, "rb", sys.stdin), (1, "wb", sys.stdout), (2, "wb", sys.stderr)):
        raw = open(fd, mode, buffering=0 if unbuffered and fd else -1, closefd=False)
        line_buffering = fd == 2 or (fd == 1 and os.isatty(1))
        streams.append(
            io.TextIOWrapper(
                raw,
                encoding=old.encoding,
                errors=old.errors,
                line_buffering=line_buffering and not unbuffered,
                write_through=unbuffered and fd != 0,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _flush(code: int = 1) -> int:
    """Flush stdout and stderr as the interpreter does at exit: a failed flush of stdout is exit code 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            if stream is sys.stdout and code == 0:
                code = 120
    return code


if __name__ == "__main__":
    serve(int(sys.argv[1]))
