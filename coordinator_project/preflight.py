"""One line, never a traceback, for an operator's mistakes (issue 24.3).

`manage.py`, gunicorn (`gunicorn_conf.py`, in the master before any worker forks) and the
Celery app check the environment before Django loads, and `manage.py` turns the errors an
operator causes (no database, a database not migrated, Redis unreachable, output piped into
`head`) into one line on stderr and a non-zero exit. Anything else is a bug and keeps its
traceback. All three read the settings file named by RSC_ENV_FILE first (NAME=value lines;
the environment wins over it), so a command printed with `RSC_ENV_FILE=...` works as printed. Imports nothing from Django at module level: it runs before the settings exist.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

# Operator commands that only read the database: they need DATABASE_URL, not the web tier's
# SECRET_KEY (nothing they do is signed). manage.py tells the settings so (READ_ONLY_ENV).
READ_ONLY_COMMANDS = frozenset({
    "describe_group", "list_groups", "list_streams", "describe_stream", "list_api_keys", "list_members",
})
READ_ONLY_ENV = "RSC_READ_ONLY_COMMAND"
EXIT_CONFIG = 2  # the environment is wrong (SECRET_KEY, DATABASE_URL scheme)
EXIT_UNAVAILABLE = 3  # a service the command needs is missing or unreachable (as rsc-dataplane)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell tool killed by it

SECRET_KEY_MISSING = (
    "SECRET_KEY is not set (and DEBUG is off): set it to one long random value shared by every"  # noqa: S105 - a message
    " coordinator process, e.g. export SECRET_KEY=\"$(python3 -c 'import secrets;"
    " print(secrets.token_urlsafe(50))')\""
)

# dj_database_url's schemes the coordinator runs on (PostgreSQL; SQLite for the quick start).
SUPPORTED_SCHEMES = ("postgres", "postgresql", "pgsql", "sqlite")


ENV_FILE_VARIABLE = "RSC_ENV_FILE"


class EnvFileError(Exception):
    """RSC_ENV_FILE names a file that cannot be read or has a line that is not NAME=value."""


def read_env_file(path: str) -> dict[str, str]:
    """NAME=value lines (`export ` allowed, `#` comments and blank lines skipped, one level of
    matching quotes removed): the format of systemd's EnvironmentFile and of `.env.example`."""
    try:
        text = open(path, encoding="utf-8").read()  # noqa: SIM115 - read at once
    except OSError as exc:
        raise EnvFileError(f"{ENV_FILE_VARIABLE}={path}: cannot read it ({exc.strerror})") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise EnvFileError(f"{path} line {number}: expected NAME=value, found {raw.strip()[:60]!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name] = value
    return values


def load_env_file() -> None:
    """The settings in RSC_ENV_FILE, under what the environment already sets (it wins)."""
    path = os.environ.get(ENV_FILE_VARIABLE, "")
    if path:
        for name, value in read_env_file(path).items():
            os.environ.setdefault(name, value)


def secret_key_problem(environ: os._Environ[str] | dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    debug = env.get("DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}
    if env.get("SECRET_KEY") or debug or env.get(READ_ONLY_ENV):
        return None
    return SECRET_KEY_MISSING


def database_url_problem(url: str) -> str | None:
    """An unknown DATABASE_URL scheme, named with the ones that work."""
    if not url:
        return None
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme in SUPPORTED_SCHEMES:
        return None
    shown = f"{scheme}://" if scheme else repr(url.split("@")[-1][:40])
    return (f"DATABASE_URL has an unknown scheme {shown}: use postgres://USER@HOST:5432/NAME"
            " (or leave it unset for the SQLite quick start)")


def environment_problem() -> str | None:
    """Reads RSC_ENV_FILE first (into the environment), so every later reader sees it."""
    try:
        load_env_file()
    except EnvFileError as exc:
        return str(exc)
    return (secret_key_problem() or database_url_problem(os.environ.get("DATABASE_URL", ""))
            or metrics_dir_problem())


def metrics_dir_problem() -> str | None:
    """PROMETHEUS_MULTIPROC_DIR, when set, must be a directory: prometheus_client writes a file
    there as soon as a metric is defined, in every process that loads the app (manage.py and
    Celery too), and a missing one was a traceback on every command. Created here when missing,
    as gunicorn's config does."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if not path:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return (f"PROMETHEUS_MULTIPROC_DIR={path} is not a directory and cannot be made one"
                f" ({exc.strerror or exc}): point it at a writable directory, or leave it unset"
                " (gunicorn then makes one of its own)")
    return None


def exit_on_environment_problem(program: str) -> None:
    """For gunicorn's master and the Celery app: stop with one line before Django loads."""
    problem = environment_problem()
    if problem is not None:
        print(f"{program}: error: {problem}", file=sys.stderr, flush=True)
        os._exit(EXIT_CONFIG)  # not SystemExit: gunicorn and celery would print more


# --- errors while a command runs -----------------------------------------------------------
def _database_where() -> str:
    from django.conf import settings

    db = settings.DATABASES.get("default", {})
    if str(db.get("ENGINE", "")).endswith("sqlite3"):
        return f"SQLite {db.get('NAME')}"
    host, port, name = db.get("HOST") or "localhost", db.get("PORT") or 5432, db.get("NAME")
    return f"PostgreSQL {host}:{port}/{name}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return type(exc).__name__


def database_problem(exc: BaseException) -> str | None:
    """The one line for a database error an operator causes, or None (a bug: traceback)."""
    from django.db import OperationalError, ProgrammingError

    if not isinstance(exc, OperationalError | ProgrammingError):
        return None
    text = _first_line(exc)
    where = _database_where()
    missing_db = re.search(r'database "([^"]+)" does not exist', text)
    if missing_db:
        name = missing_db.group(1)
        return (f"database {name!r} does not exist ({where}): create it (createdb {name}),"
                " then run manage.py migrate")
    from coordinator_project.migration_state import missing_schema

    missing = missing_schema(exc)
    if missing == "table":
        return f"the database {where} is not migrated: run manage.py migrate"
    if missing == "column":
        # Migrated by an older release (an upgrade without migrate). Only when migrations are
        # in fact unapplied: a column missing otherwise is a bug, and keeps its traceback.
        pending = _unapplied_migrations()
        if pending:
            more = f" and {len(pending) - 1} more" if len(pending) > 1 else ""
            return (f"the database {where} lacks migrations of this release ({pending[0]}{more}):"
                    " run manage.py migrate")
    if isinstance(exc, OperationalError):
        return (f"cannot use the database {where}: {text}; check DATABASE_URL and that the"
                " database server is running")
    return None


def _unapplied_migrations() -> list[str]:
    """The default database's migrations not applied yet ("app.name"), [] if unknown."""
    try:
        from django.db import connections

        from coordinator_project.migration_state import pending_migrations

        connections["default"].close()  # a fresh connection: the failed statement's may be unusable
        return pending_migrations()
    except Exception:
        return []


def redis_problem(exc: BaseException) -> str | None:
    try:
        import redis
    except ImportError:  # pragma: no cover - a requirement
        return None
    if not isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return None
    from django.conf import settings

    url = getattr(settings, "STREAM_REDIS_URL", "") or getattr(settings, "REDIS_URL", "")
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379}{parts.path}" if parts.hostname else url
    return (f"cannot reach Redis at {where}: {_first_line(exc)}; check REDIS_URL"
            " (STREAM_REDIS_URL for the shard streams) and that Redis is running")


def configuration_problem(exc: BaseException) -> str | None:
    from django.core.exceptions import ImproperlyConfigured

    if isinstance(exc, ImproperlyConfigured):
        return _first_line(exc)
    return None


PROBLEMS: tuple[Callable[[BaseException], str | None], ...] = (
    configuration_problem, database_problem, redis_problem,
)


def exit_code(exc: BaseException) -> int:
    from django.core.exceptions import ImproperlyConfigured

    return EXIT_CONFIG if isinstance(exc, ImproperlyConfigured) else EXIT_UNAVAILABLE


def quiet_broken_pipe() -> int:
    """The reader of our output went away (`| head`): stop quietly, as shell tools do.
    Python would otherwise report the pipe again when it flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def run_management(argv: Sequence[str]) -> int:
    """`manage.py`: Django's command line with operator mistakes as one line on stderr."""
    command = argv[1] if len(argv) > 1 else ""
    if command in READ_ONLY_COMMANDS:
        os.environ.setdefault(READ_ONLY_ENV, "1")
    informational = command in ("", "help", "--help", "-h", "version", "--version")
    problem = environment_problem()
    if problem is not None and not (informational and problem == SECRET_KEY_MISSING):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(list(argv))
    except BrokenPipeError:
        return quiet_broken_pipe()
    except Exception as exc:
        for problem_of in PROBLEMS:
            line = problem_of(exc)
            if line is not None:
                print(f"error: {line}", file=sys.stderr)
                return exit_code(exc)
        raise
    return 0
