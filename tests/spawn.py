"""Start the project's Python programs for tests, forked from an interpreter that has already
imported the libraries they all load (docs/decisions/0019, third round).

The suite is CPU-bound on two cores, and a third of a ``manage.py`` run or a gunicorn master's
start is Python importing Django, DRF, psycopg, redis and httpx: 0.7-0.9 CPU-s a run, 0.2-0.3 of
it once those are in memory. Each xdist worker keeps one *zygote*: a process that imported them
(no settings, no connections, no threads) and forks a child per request. The child takes the
request's environment, working directory, argv and stdio, then runs ``manage.py`` or
``python -m <module>`` exactly as the interpreter would run it as ``__main__``. Settings,
Django's set-up, the app and its connections all start in the child, from its own environment.

``Popen`` and ``run`` take ``subprocess``'s arguments and return what it returns (a process
object with ``pid``, ``poll``, ``wait``, ``send_signal``, ``communicate``; a
``CompletedProcess``). Anything the zygote does not reproduce (interpreter flags, ``-c``,
another executable, ``shell``, ``pass_fds``, environment variables read when the preloaded
libraries are imported) goes to ``subprocess`` unchanged, and ``RSC_TEST_ZYGOTE=0`` sends
everything there.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent

# Libraries every coordinator process imports, none of which reads the environment or starts a
# thread when imported (prometheus_client reads PROMETHEUS_MULTIPROC_DIR on import: not here).
# Also what the project's processes import later, found by py-spy over a whole run: httpcore,
# which httpx imports when a client opens its first transport and which then imports trio
# (selenium's, with the dev requirements) in every member, CLI and command that speaks HTTP;
# DRF's optional yaml, and django.test (drf-spectacular imports DRF's test client), in every
# coordinator process; gevent, which the coordinator's modules import outside gunicorn too.
# A web worker's app load went from 0.25 to 0.15 CPU-s with these.
PRELOAD = (
    "django.core.management", "django.db.models", "django.http", "django.urls",
    "django.contrib.admin", "django.contrib.admin.sites", "django.contrib.admin.filters",
    "django.template.defaulttags", "django.template.defaultfilters", "django.views.generic.base",
    "django.utils.log", "django.core.serializers.json", "django.test", "rest_framework",
    "psycopg", "redis", "httpx", "httpcore", "yaml", "gevent", "dj_database_url", "importlib.metadata",
)
GUNICORN_PRELOAD = ("gunicorn.app.wsgiapp", "gunicorn.arbiter", "gunicorn.config")
# Environment the preloaded imports (or the interpreter's start) read: a request that sets any
# of these differently from the zygote goes to subprocess.
_READ_AT_START = ("PYTHON", "PSYCOPG_", "OTEL_", "REDIS_PY", "HTTPX_", "GEVENT")
_PER_CHILD = {"PYTHONPATH", "PYTHONUNBUFFERED"}
_ALLOWED_KWARGS = {"cwd", "env", "stdin", "stdout", "stderr", "text", "universal_newlines",
                   "encoding", "errors", "start_new_session", "bufsize", "close_fds"}
# subprocess.Popen's defaults of arguments the zygote cannot honour otherwise.
_DEFAULT_KWARGS: dict[str, Any] = {"shell": False, "executable": None, "preexec_fn": None, "pass_fds": (),
                                   "restore_signals": True, "process_group": None}
_HEADER = struct.Struct("!I")
# The zygote keeps the standard library's own calls, taken before gevent patches them: patched,
# they would start a hub here, and every child would inherit its event loop.
fork, close, waitpid, wait_for, set_handler, plain_socket = (
    os.fork, os.close, os.waitpid, select.select, signal.signal, socket.socket)


# ---- the zygote (python -m tests.spawn <socket path>) --------------------------------------

def _serve(path: str, flavour: str) -> None:
    gc.disable()  # the imports below build objects that live as long as the zygote: no cycles to find
    if flavour == "gevent":
        # As `gunicorn -c coordinator_project/gunicorn_conf.py` runs: gunicorn is imported, then
        # the config patches the standard library, then the app loads (decision 0020).
        for name in GUNICORN_PRELOAD:
            __import__(name)
        from gevent import monkey

        monkey.patch_all()
    for name in PRELOAD:
        __import__(name)
    assert threading.active_count() == 1, "a preloaded import started a thread: fork is unsafe"
    from django.conf import settings

    assert not settings.configured, "a preloaded import read the settings: they are each child's own"
    # What the zygote loaded is every child's for its whole life: frozen, no collector pass of a
    # child walks it (it was ~9 % of the suite's CPU), nor writes to its pages, which fork shares
    # until a child writes them. The collector's thresholds stay the interpreter's: the gunicorn
    # config sets a worker's own (webserver/collector.py) and a test checks them.
    gc.freeze()
    gc.enable()
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    listener = plain_socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    set_handler(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        ready, _, _ = wait_for([listener, wake_r, sys.stdin.fileno(), *children.values()], [], [])
        if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 1024):
            return  # the test process is gone
        if wake_r in ready:
            os.read(wake_r, 1024)
            while True:
                try:
                    pid, status = waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(b"X%d\n" % status)
                    conn.close()
        for pid, conn in list(children.items()):
            if conn in ready:  # the test let go of the process (or died): nobody to tell
                children.pop(pid).close()
        if listener in ready:
            fd, _ = listener._accept()  # (accept() would wrap it in gevent's socket)
            conn = plain_socket(fileno=fd)
            request, fds = _receive(conn)
            started_r, started_w = os.pipe()
            pid = fork()
            if pid == 0:
                zygote_fds = [listener.fileno(), wake_r, wake_w, started_r, conn.fileno(),
                              *(c.fileno() for c in children.values())]
                _child(request, fds, started_w, zygote_fds, base_path)  # never returns
            close(started_w)
            os.read(started_r, 1)  # as subprocess returns: once the child's session and stdio are set
            close(started_r)
            for fd in fds:
                close(fd)
            conn.sendall(b"P%d\n" % pid)
            children[pid] = conn


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, ancdata, _, _ = conn.recvmsg(_HEADER.size, socket.CMSG_SPACE(3 * 4))
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(payload) // 4}i", payload))
    (size,) = _HEADER.unpack(data)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("request cut short")
        body += chunk
    return json.loads(body), fds


def _child(request: dict[str, Any], fds: list[int], started: int, zygote_fds: list[int],
           base_path: list[str]) -> None:
    code = 1
    try:
        if "gevent" in sys.modules:
            import gevent

            gevent.reinit()  # what gevent's own fork does in the child: the event loop anew
        signal.set_wakeup_fd(-1)
        set_handler(signal.SIGCHLD, signal.SIG_DFL)
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(request["cwd"])
        os.write(started, b"1")
        # The zygote's own descriptors, and what it received (now 0-2). Nothing else is open
        # here but the event loop's, which gevent.reinit() has made this process's own.
        for fd in {*zygote_fds, *fds, started} - {0, 1, 2}:
            os.close(fd)
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8",
                                      line_buffering=os.isatty(1), write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True, write_through=unbuffered)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        argv: list[str] = request["argv"]
        import runpy

        if argv[0] == "-c":
            sys.path[:] = ["", *extra, *base_path]
            sys.argv = ["-c", *argv[2:]]
            main = type(sys)("__main__")
            sys.modules["__main__"] = main
            code = _run_main(lambda: exec(compile(argv[1], "<string>", "exec"), main.__dict__))  # noqa: S102 - `python -c` runs its code
        elif argv[0] == "-m":
            sys.path[:] = [os.getcwd(), *extra, *base_path]
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in argv[0]
            code = _run_main(lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
        else:
            script = os.path.abspath(argv[0])
            sys.path[:] = [os.path.dirname(script), *extra, *base_path]
            sys.argv = list(argv)
            code = _run_main(lambda: runpy.run_path(script, run_name="__main__"))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_main(main: Any) -> int:
    """Run ``main`` as the interpreter runs ``__main__``: SystemExit's code, a traceback and 1
    for an uncaught exception, then non-daemon threads joined and atexit handlers run."""
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at exit
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    return code


# ---- the test side ----------------------------------------------------------------------------

class _Zygote:
    def __init__(self, flavour: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="rsc-zygote-")
        self.path = os.path.join(self.dir, "sock")
        # Without DJANGO_SETTINGS_MODULE: a preloaded import that reads the settings fails here
        # instead of fixing the zygote's settings in every child.
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.spawn", self.path, flavour], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it listens, or EOF if it failed
        if line.strip() != b"ready":
            raise RuntimeError(f"the test zygote did not start (exit status {self.proc.wait()})")
        atexit.register(self.close)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.dir)

    def accepts(self, env: Mapping[str, str]) -> bool:
        keys = {k for k in (*env, *self.env) if k.startswith(_READ_AT_START) and k not in _PER_CHILD}
        return all(env.get(k) == self.env.get(k) for k in keys)


_zygotes: dict[str, _Zygote] = {}
_zygote_lock = threading.Lock()


def _get_zygote(flavour: str) -> _Zygote:
    with _zygote_lock:
        zygote = _zygotes.get(flavour)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = _zygotes[flavour] = _Zygote(flavour)
        return zygote


def _program(args: Any, env: Mapping[str, str]) -> tuple[list[str], str] | None:
    """What a zygote runs for ``args`` and which zygote ("plain", or "gevent" for gunicorn with
    the shipped config, which patches before the app loads), or None: a new interpreter."""
    if isinstance(args, (str, bytes, os.PathLike)) or not args:
        return None
    argv = [os.fspath(a) for a in args]
    if argv[0] != sys.executable or len(argv) < 2:
        return None
    if argv[1:3] == ["-m", "gunicorn"]:
        shipped = "-c" in argv and argv[argv.index("-c") + 1] == "coordinator_project/gunicorn_conf.py"
        patches = (env.get("PRELOAD_APP", "1") != "0"
                   and "gevent" in env.get("WORKER_CLASS", "webserver.worker.GuardedGeventWorker").lower())
        if shipped and patches and not {"-k", "--worker-class", "--preload"} & set(argv):
            return argv[1:], "gevent"
        return None
    if argv[1] == "-m" and len(argv) >= 3:
        return argv[1:], "plain"
    if argv[1] == "-c" and len(argv) >= 3 and "gevent" not in argv[2]:
        return argv[1:], "plain"  # (gevent would patch what the zygote imported unpatched)
    if argv[1].endswith(".py"):
        return argv[1:], "plain"
    return None


class ZygoteProcess:
    """A child of the zygote, with the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, args: Sequence[str], conn: socket.socket, pid: int, stdin: IO[Any] | None,
                 stdout: IO[Any] | None, stderr: IO[Any] | None, early: bytes = b"") -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._conn = conn
        self._buf = early  # the zygote's lines read with its first (an exit already reported)
        self._readers: dict[str, tuple[threading.Thread, list[Any]]] = {}
        self._lock = threading.Lock()  # one reader of the zygote's reply (poll from a watcher thread)

    def _collect(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            return self._collect_locked(deadline)
        finally:
            self._lock.release()

    def _collect_locked(self, deadline: float | None) -> bool:
        while self.returncode is None:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.startswith(b"X"):
                    self.returncode = os.waitstatus_to_exitcode(int(line[1:]))
                    self._conn.close()
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return False
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the test zygote went away while {self.pid} ran")
            self._buf += chunk
        return True

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._collect(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._readers:
            if self.stdin is not None:
                def feed() -> None:
                    with contextlib.suppress(BrokenPipeError):
                        if input:
                            self.stdin.write(input)  # type: ignore[union-attr]
                        self.stdin.close()  # type: ignore[union-attr]
                threading.Thread(target=feed, daemon=True).start()
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    out: list[Any] = []
                    t = threading.Thread(target=lambda s=stream, o=out: o.append(s.read()), daemon=True)
                    t.start()
                    self._readers[name] = (t, out)
        for t, _ in self._readers.values():
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        got = {name: out[0] if out else None for name, (_, out) in self._readers.items()}
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None:
                stream.close()
        return got.get("stdout"), got.get("stderr")

    def __enter__(self) -> ZygoteProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()


def _fd_for(spec: Any, default: int, mode: str, opened: list[int]) -> tuple[int, int | None]:
    """(fd for the child, our end of a pipe or None) for a subprocess-style stdio argument."""
    if spec is None:
        return default, None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        child, ours = (r, w) if mode == "r" else (w, r)
        opened.append(child)
        return child, ours
    if isinstance(spec, int):
        return spec, None
    return spec.fileno(), None


def Popen(args: Any, **kwargs: Any) -> Any:
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    found = _program(args, env)
    # An argument at subprocess's default asks for nothing a zygote does not do (a caller's
    # `shell=False, executable=None` sent every one of its commands to a new interpreter).
    asked = {k for k, v in kwargs.items() if not (k in _DEFAULT_KWARGS and v == _DEFAULT_KWARGS[k])}
    if (found is None or os.environ.get("RSC_TEST_ZYGOTE") == "0" or asked - _ALLOWED_KWARGS
            or kwargs.get("close_fds") is False):
        return subprocess.Popen(args, **kwargs)
    program, flavour = found
    zygote = _get_zygote(flavour)
    if not zygote.accepts(env):
        return subprocess.Popen(args, **kwargs)
    text = bool(kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
                or kwargs.get("errors"))
    opened: list[int] = []
    try:
        in_fd, in_ours = _fd_for(kwargs.get("stdin"), 0, "r", opened)
        out_fd, out_ours = _fd_for(kwargs.get("stdout"), 1, "w", opened)
        if kwargs.get("stderr") == subprocess.STDOUT:
            err_fd, err_ours = out_fd, None
        else:
            err_fd, err_ours = _fd_for(kwargs.get("stderr"), 2, "w", opened)
        request = json.dumps({
            "argv": program, "env": env, "cwd": os.fspath(kwargs.get("cwd") or os.getcwd()),
            "new_session": bool(kwargs.get("start_new_session")),
        }).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(zygote.path)
        conn.sendmsg([_HEADER.pack(len(request))],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", in_fd, out_fd, err_fd))])
        conn.sendall(request)
        pid, early = read_started(conn)
    finally:
        for fd in opened:
            os.close(fd)

    def wrap(fd: int | None, mode: str) -> IO[Any] | None:
        if fd is None:
            return None
        raw = os.fdopen(fd, mode + "b")
        if not text:
            return raw
        return io.TextIOWrapper(raw, encoding=kwargs.get("encoding") or "utf-8",  # type: ignore[arg-type]
                                errors=kwargs.get("errors") or "strict", write_through=mode == "w")

    return ZygoteProcess(list(args), conn, pid, wrap(in_ours, "w"), wrap(out_ours, "r"), wrap(err_ours, "r"),
                         early)


def read_started(conn: socket.socket) -> tuple[int, bytes]:
    """The zygote's first line (``P<pid>``) and what came after it. A child that exits at once
    has its ``X<status>`` line sent right behind, and one recv can return both: that part
    belongs to the process's exit, which `ZygoteProcess` reads."""
    reply = b""
    while b"\n" not in reply:
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError("the test zygote did not start the process")
        reply += chunk
    line, rest = reply.split(b"\n", 1)
    if not line.startswith(b"P"):
        raise RuntimeError(f"the test zygote answered {line!r}, not a started process")
    return int(line[1:]), rest


def run(args: Any, *, input: Any = None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run``, through the zygote where it can."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(args, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout or 0, exc.output, exc.stderr) from None
        retcode = proc.poll()
        assert retcode is not None
    completed = subprocess.CompletedProcess(proc.args, retcode, stdout, stderr)
    if check:
        completed.check_returncode()
    return completed


# A bash function that runs a shell block's `.venv/bin/python manage.py ...` lines through the
# zygote (tests/zygote_client.py); any other use of `.venv/bin/python` runs the interpreter.
_SHELL_FUNCTION = (
    '.venv/bin/python() { if [ "${1-}" = manage.py ]; then '
    '"$RSC_TEST_PYTHON" -I -S "$RSC_TEST_CLIENT" "$@"; else command .venv/bin/python "$@"; fi; }\n'
)


def shell_prelude(env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """What a bash script run with `env` starts with, and the variables it needs, so that its
    `.venv/bin/python manage.py ...` commands are forked from this process's zygote; nothing
    where the zygote would not run them as a new interpreter would (or RSC_TEST_ZYGOTE=0)."""
    if os.environ.get("RSC_TEST_ZYGOTE") == "0":
        return "", {}
    zygote = _get_zygote("plain")
    if not zygote.accepts(env):
        return "", {}
    return _SHELL_FUNCTION, {"RSC_TEST_ZYGOTE_SOCK": zygote.path, "RSC_TEST_PYTHON": sys.executable,
                             "RSC_TEST_CLIENT": str(ROOT / "tests" / "zygote_client.py")}


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
