"""`make run`: the whole system on this machine, supervised.

Starts the coordinator (gunicorn), the Celery worker and beat, then a demo producer and two
demo members (the data-plane library), and prints every part's output prefixed with its name.
SQLite in var/ is the default when DATABASE_URL is unset; a local redis-server is started (as
a supervised part) when none answers at REDIS_URL.

Why a supervisor of its own rather than a Procfile runner: stopping is ordered. The members
must leave their group (-1) while the coordinator still answers, so they stop first, then the
coordinator, worker and beat, then a Redis this script started.

- Each part runs in a session of its own, so a terminal's Ctrl-C reaches only this process,
  which then stops the parts in order. Each part also gets PR_SET_PDEATHSIG (Linux): if this
  process dies without stopping them (SIGKILL), the kernel sends them SIGTERM.
- SIGINT, SIGTERM, SIGHUP and a closed stdout (`make run | tee log` with tee gone) all stop
  everything; output then goes to stderr, or nowhere.
- A busy port is an error before anything starts; readiness is checked against the gunicorn
  started here (/healthz answers this run's id), never a server left over from before.
- Exit status: 0 after a requested stop, 1 when a part fails, 2 when it cannot start.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PR_SET_PDEATHSIG = 1
DEMO_STOP_TIMEOUT_S = 20.0  # members leave (-1) and finish in-flight handlers
CORE_STOP_TIMEOUT_S = 15.0
EXIT_OK, EXIT_PART_FAILED, EXIT_CANNOT_START = 0, 1, 2


class CannotStart(Exception):
    """A precondition failed before (or while) the parts started: one line for the user."""


def _die_with_parent(parent: int) -> Callable[[], None]:
    """preexec_fn: SIGTERM this child when the supervisor dies (Linux; elsewhere a no-op)."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def preexec() -> None:
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class Part:
    name: str
    argv: list[str]
    stage: str  # "demo" stops first, then "core", then "redis"
    proc: subprocess.Popen[bytes] | None = None
    buffer: bytes = b""
    exit_reported: bool = field(default=False)


class Output:
    """Lines to stdout; once stdout is gone (EPIPE), to stderr; once that is gone, nowhere."""

    def __init__(self) -> None:
        self.streams = [sys.stdout, sys.stderr]
        self.stdout_closed = False

    def line(self, text: str) -> None:
        while self.streams:
            stream = self.streams[0]
            try:
                stream.write(text + "\n")
                stream.flush()
                return
            except (BrokenPipeError, OSError, ValueError):
                if stream is sys.stdout:
                    self.stdout_closed = True
                self.streams.pop(0)
                # Point the fd at /dev/null so the interpreter's final flush does not fail too.
                try:
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, stream.fileno())
                    os.close(devnull)
                except (OSError, ValueError):
                    pass


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Output()
        self.parts: list[Part] = []
        self.selector = selectors.DefaultSelector()
        self.stop_reason: str | None = None
        self.failed: str | None = None
        self.run_id = secrets.token_hex(8)
        self.url = f"http://{args.host}:{args.port}"
        self.env = dict(os.environ)
        self.env.update(
            DJANGO_SETTINGS_MODULE="coordinator_project.settings",
            DEBUG=self.env.get("DEBUG", "1"),
            REDIS_URL=args.redis_url,
            PORT=str(args.port),
            PYTHONUNBUFFERED="1",
            RSC_RUN_ID=self.run_id,
        )

    # -- signals and output -----------------------------------------------------------------
    def install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name

    def say(self, text: str) -> None:
        self.out.line(text)
        if self.out.stdout_closed and self.stop_reason is None:
            self.stop_reason = "stdout closed"

    def pump(self, seconds: float) -> None:
        """Copy the parts' output for up to `seconds`, line by line, prefixed with the part."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            for key, _ in self.selector.select(timeout=max(0.0, min(remaining, 0.2))):
                part: Part = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    self.selector.unregister(key.fd)
                    if part.buffer:
                        self._emit(part, part.buffer)
                    part.buffer = b""
                    continue
                *lines, part.buffer = (part.buffer + chunk).split(b"\n")
                for raw in lines:
                    self._emit(part, raw)
            if remaining <= 0 or self.stop_reason is not None:
                return

    def _emit(self, part: Part, raw: bytes) -> None:
        self.say(f"{part.name:<8}| {raw.decode(errors='replace').rstrip()}")

    # -- parts ------------------------------------------------------------------------------
    def start(self, name: str, argv: list[str], stage: str, **env: str) -> Part:
        part = Part(name, argv, stage)
        part.proc = subprocess.Popen(
            argv, cwd=ROOT, env={**self.env, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent(os.getpid()),
        )
        assert part.proc.stdout is not None
        os.set_blocking(part.proc.stdout.fileno(), False)
        self.selector.register(part.proc.stdout.fileno(), selectors.EVENT_READ, part)
        self.parts.append(part)
        return part

    def check_parts(self) -> None:
        """A part that exits while the system runs is a failure: stop the rest."""
        for part in self.parts:
            assert part.proc is not None
            code = part.proc.poll()
            if code is not None and not part.exit_reported:
                part.exit_reported = True
                self.failed = self.failed or f"{part.name} exited with status {code}"
                self.say(f"== {part.name} exited with status {code}; stopping the rest")

    def stop_stage(self, stage: str, timeout: float) -> None:
        parts = [p for p in self.parts if p.stage == stage and p.proc and p.proc.poll() is None]
        for part in parts:  # the part itself: gunicorn and Celery stop their own workers
            assert part.proc is not None
            part.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(p.proc and p.proc.poll() is None for p in parts) and time.monotonic() < deadline:
            self.pump(0.1)
        for part in parts:
            if part.proc and part.proc.poll() is None:
                self.say(f"== {part.name} did not stop within {timeout:.0f} s: killing it")
                self._signal(part, signal.SIGKILL)
                part.proc.wait()

    @staticmethod
    def _signal(part: Part, sig: int) -> None:
        assert part.proc is not None
        # Its session's process group: the part and its children.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(part.proc.pid, sig)

    def stop_all(self) -> None:
        self.say(f"== stopping ({self.stop_reason or self.failed}): demo members leave first")
        self.stop_stage("demo", DEMO_STOP_TIMEOUT_S)
        self.say("== stopping the coordinator, worker and beat")
        self.stop_stage("core", CORE_STOP_TIMEOUT_S)
        self.stop_stage("redis", CORE_STOP_TIMEOUT_S)
        # Whatever a part left behind in its session (pool processes of a part that died).
        # Parts exit at most a stop's length before this, so their group ids are not reused yet.
        for part in self.parts:
            self._signal(part, signal.SIGKILL)
        self.pump(0.2)
        self.say("== stopped")

    # -- start-up ---------------------------------------------------------------------------
    def check_port_free(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As gunicorn binds: TIME_WAIT leftovers do not count, a listener does.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.args.host, self.args.port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise CannotStart(f"cannot bind {self.args.host}:{self.args.port}: {exc}") from exc
                raise CannotStart(
                    f"port {self.args.port} on {self.args.host} is already in use (another `make run` "
                    f"still running, or another server). Stop it, or pick another port: "
                    f"PORT={self.args.port + 1} make run"
                ) from exc

    def redis_answers(self, timeout: float = 1.0) -> bool:
        import redis

        try:
            client = redis.Redis.from_url(self.args.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
            client.ping()
            client.close()
            return True
        except redis.RedisError:
            return False

    def ensure_redis(self) -> None:
        if self.redis_answers():
            return
        parsed = urllib.parse.urlparse(self.args.redis_url)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
        server = shutil.which("redis-server")
        if server is None or host not in {"127.0.0.1", "localhost"}:
            raise CannotStart(f"Redis at {self.args.redis_url} does not answer: start one, or set REDIS_URL")
        self.say(f"== starting a local Redis on port {port} (stopped with the rest; it keeps no data)")
        self.start("redis", [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], "redis")
        self.wait_for("Redis", lambda: self.redis_answers(0.5), 20.0)

    def manage(self, *argv: str) -> str:
        """Run a manage.py command to completion (or until a stop); its output on failure."""
        proc = subprocess.Popen([PY, "manage.py", *argv], cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
        while True:
            try:
                out, err = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if self.stop_reason is not None:
                    proc.terminate()
                    proc.communicate()
                    raise CannotStart(f"stopped during manage.py {argv[0]}") from None
        if proc.returncode != 0:
            for text in (out, err):
                for raw in text.strip().splitlines()[-20:]:
                    self.say(f"manage  | {raw}")
            raise CannotStart(f"manage.py {argv[0]} failed (status {proc.returncode})")
        return out

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.check_parts()
            if self.failed or self.stop_reason:
                raise CannotStart(f"{what} did not become ready: {self.failed or self.stop_reason}")
            if time.monotonic() > deadline:
                raise CannotStart(f"{what} did not become ready within {timeout:.0f} s")
            self.pump(0.2)

    def coordinator_ready(self) -> bool:
        """Our gunicorn answers /healthz with this run's id, and /readyz is green."""
        import httpx

        # One TLS context for every poll: httpx.get builds one per call (~37 ms of CPU each).
        from dataplane.transport import tls_context

        try:
            health = httpx.get(f"{self.url}/healthz", timeout=1, verify=tls_context())
            if health.status_code != 200:
                return False
            if health.json().get("runId") != self.run_id:
                raise CannotStart(f"another server answers at {self.url} (not the one started now)")
            return httpx.get(f"{self.url}/readyz", timeout=2, verify=tls_context()).status_code == 200
        except (httpx.HTTPError, ValueError):
            return False

    def run(self) -> int:
        self.install_signals()
        try:
            self.check_port_free()
            var = Path(self.args.var_dir)
            var.mkdir(parents=True, exist_ok=True)
            self.ensure_redis()
            self.say(f"== database: {self.env.get('DATABASE_URL') or 'SQLite at ' + self.sqlite_path()}")
            self.write_env_file(var)
            demo = json.loads(self.manage("demo_setup", "--prepare"))  # migrate, collectstatic, the demo
            self.start_core(var)
            self.wait_for("the coordinator", self.coordinator_ready, self.args.ready_timeout)
            self.start_demo(demo)
            self.banner(demo)
        except CannotStart as exc:
            requested = self.stop_reason  # Ctrl-C (or the like) while starting: a normal stop
            if not requested:
                self.say(f"== cannot start: {exc}")
                print(f"make run: {exc}", file=sys.stderr)
            self.stop_reason = requested or "start-up failed"
            self.stop_all()
            return EXIT_OK if requested else EXIT_CANNOT_START
        while self.stop_reason is None and self.failed is None:
            self.pump(0.5)
            self.check_parts()
        self.stop_all()
        if self.failed:
            print(f"make run: {self.failed}", file=sys.stderr)
            return EXIT_PART_FAILED
        return EXIT_OK

    def write_env_file(self, var: Path) -> None:
        """var/run.env: the settings of this run, so the commands the banner prints work in the
        user's shell as printed (manage.py reads the file RSC_ENV_FILE names). The admin password
        of the first run is kept in it and reused."""
        self.env_file = var / "run.env"
        previous: dict[str, str] = {}
        if self.env_file.exists():
            for line in self.env_file.read_text().splitlines():
                name, sep, value = line.partition("=")
                if sep and not name.startswith("#"):
                    previous[name.strip()] = value.strip()
        password = self.env.get("RSC_ADMIN_PASSWORD") or previous.get("RSC_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        self.env["RSC_ADMIN_PASSWORD"] = password
        database = (f"DATABASE_URL={self.env['DATABASE_URL']}" if self.env.get("DATABASE_URL")
                    else f"SQLITE_PATH={self.sqlite_path()}")
        self.env_file.write_text("\n".join([
            "# Written by make run (scripts/run.py): the quick start's settings, for",
            "#   RSC_ENV_FILE=<this file> .venv/bin/python manage.py ...",
            "# Not for production: DEBUG is on. See .env.example and docs/OPERATING.md.",
            "DEBUG=1",
            f"REDIS_URL={self.env['REDIS_URL']}",
            database,
            f"RSC_ADMIN_PASSWORD={password}",
            "",
        ]))
        self.env_file.chmod(0o600)  # it holds the admin password

    def try_command(self, demo: Mapping[str, object]) -> str:
        """The banner's "try:" line: a reshard to more shards than the stream has now (or, while
        one runs, where to watch it), prefixed with the env file so it works as printed."""
        path = self.env_file
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        prefix = f"RSC_ENV_FILE={shown} .venv/bin/python manage.py"
        if demo.get("streamState", "STABLE") != "STABLE":
            return f"{prefix} describe_stream {demo['stream']}   # a reshard is in progress"
        return f"{prefix} reshard {demo['stream']} --shards {int(demo['shards']) + 2}   # then watch the admin"  # type: ignore[call-overload]

    def sqlite_path(self) -> str:
        return self.env.get("SQLITE_PATH", str(ROOT / "var" / "coordinator.sqlite3"))

    def start_core(self, var: Path) -> None:
        celery = str(Path(PY).with_name("celery"))
        gunicorn = str(Path(PY).with_name("gunicorn"))
        # The config file picks the worker class and count; only the bind address is ours.
        self.start("web", [gunicorn, "-c", "coordinator_project/gunicorn_conf.py", "coordinator_project.wsgi",
                           "-b", f"{self.args.host}:{self.args.port}"], "core")
        # WARNING: at INFO they log every beat tick (two tasks every SWEEP_INTERVAL_SECONDS).
        self.start("worker", [celery, "-A", "coordinator_project", "worker", "--loglevel=WARNING",
                              "--concurrency=1", "--without-gossip", "--without-mingle"], "core")
        self.start("beat", [celery, "-A", "coordinator_project", "beat", "--loglevel=WARNING",
                            "--schedule", str(var / "celerybeat-schedule")], "core")

    def start_demo(self, demo: dict[str, str]) -> None:
        for member in ("demo-1", "demo-2"):
            self.start(member, [PY, "-m", "dataplane", "consume", "--coordinator", self.url,
                                "--group", demo["group"], "--redis", self.args.redis_url,
                                "--handler", "demo.handler:handle", "--member-id", member, "-v"],
                       "demo", DEMO_MEMBER=member, RSC_API_KEY=demo["groupKey"])
        self.start("producer", [PY, "-m", "demo.producer", "--coordinator", self.url, "--stream", demo["stream"],
                                "--redis", self.args.redis_url], "demo", RSC_API_KEY=demo["streamKey"])

    def banner(self, demo: dict[str, str]) -> None:
        url = self.url
        for text in (
            "",
            "== Redis Stream Coordinator is running",
            f"   admin:     {url}/admin/   (user: {demo['adminUser']}  password: {demo['adminPassword']})",
            f"   API docs:  {url}/api/docs/      metrics: {url}/metrics",
            f"   namespace: {demo['namespace']} (Redis key prefix of new streams and the Celery queue)",
            f"   describe:  curl -H 'Authorization: Bearer {demo['groupKey']}' {url}/api/v1/groups/{demo['group']}",
            f"   group key: {demo['groupKey']}",
            f"   stream key (producers; routing only): {demo['streamKey']}",
            f"   try:       {self.try_command(demo)}",
            "   Ctrl-C stops everything (the demo members leave the group first).",
            "",
        ):
            self.say(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--var-dir", default=str(ROOT / "var"), help="for Celery beat's schedule file")
    parser.add_argument("--ready-timeout", type=float, default=60.0, help="seconds for the coordinator to be ready")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return Supervisor(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
