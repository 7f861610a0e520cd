"""Settings, all from the environment (see README "Configuration")."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from coordinator_project.logging import REFUSAL_LOGGERS
from coordinator_project.preflight import READ_ONLY_ENV, SECRET_KEY_MISSING, database_url_problem

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


DEBUG = env_bool("DEBUG", False)
# A fixed insecure key only when DEBUG is on. Without DEBUG a missing key is fatal (issue
# 8.7): a key invented per process breaks admin sessions across workers and restarts.
SECRET_KEY = os.environ.get("SECRET_KEY") or ("dev-insecure-key" if DEBUG else "")
if not SECRET_KEY and os.environ.get(READ_ONLY_ENV):
    # A read-only operator command (describe_group, list_groups, ...) signs nothing: a key of
    # its own lets it run with database access alone (issue 24.1).
    SECRET_KEY = secrets.token_urlsafe(50)
if not SECRET_KEY:
    raise ImproperlyConfigured(SECRET_KEY_MISSING)
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
# A failed CSRF check outside the admin answers JSON (coordinator_project.errors).
CSRF_FAILURE_VIEW = "coordinator_project.errors.csrf_failure"
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# Production security behind TLS, each off by default (plain HTTP on loopback).
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT")
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]  # probes and scrapes on plain HTTP
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES")
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips it from clients).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("SECURE_PROXY_SSL_HEADER") else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from our static files, no CDN
    "axes",  # admin login throttling (issue 27.2): lockout per account and per address
    "groups",
    "members",
    "assignments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "coordinator_project.middleware.JsonErrorPagesMiddleware",  # a view's 405 as JSON (issue 27.10)
    "coordinator_project.middleware.DatabaseUnavailableMiddleware",  # database trouble: 503, not 500
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as axes requires: it only turns a login that its backend refused into the lockout
    # answer (no query of its own; the heartbeat path never authenticates through Django).
    "axes.middleware.AxesMiddleware",
]

# The heartbeat benchmark swaps in bench.urls (adds its reference endpoints).
ROOT_URLCONF = os.environ.get("ROOT_URLCONF", "coordinator_project.urls")
WSGI_APPLICATION = "coordinator_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------
# PostgreSQL in production and tests (DATABASE_URL); SQLite for the quick start.
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if (_url_problem := database_url_problem(DATABASE_URL)) is not None:
    raise ImproperlyConfigured(_url_problem)
if DATABASE_URL:
    _default = dj_database_url.parse(DATABASE_URL, conn_max_age=600, conn_health_checks=True)
else:
    _default = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "var" / "coordinator.sqlite3")),
        # IMMEDIATE takes the write lock at BEGIN, so two writers never deadlock upgrading
        # a read lock; WAL lets readers run beside the writer.
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
DATABASES = {"default": _default}
# Issue 8.4: a database that is down, wrong or silent answers 503 in seconds, not a 30 s hang.
DB_CONNECT_TIMEOUT = env_int("DB_CONNECT_TIMEOUT", 3)  # seconds (libpq's minimum is 2)
DB_STATEMENT_TIMEOUT_MS = env_int("DB_STATEMENT_TIMEOUT_MS", 10_000)  # 0: none (e.g. a long migrate)
DB_RETRY_AFTER_SECONDS = env_int("DB_RETRY_AFTER_SECONDS", 2)  # Retry-After of that 503
# Deadlines under the gevent worker (coordinator_project.wsgi_guard, issues 27.1 and 27.4): the
# whole body must arrive within BODY_READ_TIMEOUT_SECONDS (else 408); a request not done within
# its deadline is dropped, not applied, and answers 503. The API's matches the member
# library's read timeout (5 s): past it the member has given up and will retry.
BODY_READ_TIMEOUT_SECONDS = float(os.environ.get("BODY_READ_TIMEOUT_SECONDS", "10"))
REQUEST_DEADLINE_SECONDS = float(os.environ.get("REQUEST_DEADLINE_SECONDS", "5"))
READYZ_DEADLINE_SECONDS = float(os.environ.get("READYZ_DEADLINE_SECONDS", "3"))
OTHER_REQUEST_DEADLINE_SECONDS = float(os.environ.get("OTHER_REQUEST_DEADLINE_SECONDS", "30"))
# Issue 27.2: operator requests (the admin, the API docs) run at most OPERATOR_CONCURRENCY at
# once per gevent worker, OPERATOR_QUEUE_MAX more wait their turn, the rest answer 503 at once:
# a flood of admin requests cannot take the loop the heartbeats run on (wsgi_guard.OperatorGate).
OPERATOR_CONCURRENCY = env_int("OPERATOR_CONCURRENCY", 2)
OPERATOR_QUEUE_MAX = env_int("OPERATOR_QUEUE_MAX", 100)
# Issue 27.4: a connection whose peer vanished (host down, network cut) fails within about
# DB_TCP_TIMEOUT seconds instead of waiting for the kernel's 2 hours (keepalives) or ~15 min
# (unacknowledged data). A server that is alive at the TCP level but silent is the request
# deadline's job (REQUEST_DEADLINE_SECONDS, coordinator_project.wsgi_guard).
DB_TCP_TIMEOUT = env_int("DB_TCP_TIMEOUT", 10)
if _default["ENGINE"].endswith("postgresql"):
    _default["OPTIONS"] = {
        **_default.get("OPTIONS", {}),
        "connect_timeout": DB_CONNECT_TIMEOUT,
        "keepalives": 1,
        "keepalives_idle": max(1, DB_TCP_TIMEOUT // 2),
        "keepalives_interval": max(1, DB_TCP_TIMEOUT // 6),
        "keepalives_count": 3,
        "tcp_user_timeout": DB_TCP_TIMEOUT * 1000,
        "options": " ".join(filter(None, [
            _default.get("OPTIONS", {}).get("options", ""), f"-c statement_timeout={DB_STATEMENT_TIMEOUT_MS}",
        ])),
    }
if _default["ENGINE"].endswith("postgresql"):
    # Liveness-only writes (steady-state heartbeats) go through a second connection whose
    # commits do not wait for fsync: losing a last-seen stamp in a crash costs nothing, and
    # fsync stalls here reach hundreds of ms. Ownership changes stay on "default".
    _liveness = _default.copy()  # a DBConfig (dj_database_url), as DATABASES holds
    # Server-side binding + prepare_threshold let psycopg prepare the steady-state statement
    # after a few runs: planning it cost ~0.6 ms of ~0.85 ms per heartbeat (bench/heartbeat.py).
    # enable_seqscan=off (issue 11.5): this connection runs only the steady path's statements,
    # each of which reaches its rows by a unique key; without fresh statistics (right after a
    # join storm) the planner would otherwise take a scan of the whole member table as cheap.
    _liveness["OPTIONS"] = {
        **_default.get("OPTIONS", {}),
        "options": _default["OPTIONS"]["options"] + " -c synchronous_commit=off -c enable_seqscan=off",
        "server_side_binding": True,
        "prepare_threshold": 2,
    }
    _liveness["TEST"] = {"MIRROR": "default"}
    _liveness["CONN_HEALTH_CHECKS"] = False  # fastpath drops a broken connection itself
    DATABASES["liveness"] = _liveness
if env_bool("DB_POOL") and _default["ENGINE"].endswith("postgresql"):
    # Issue 8.2: the gevent worker (gunicorn_conf.py sets DB_POOL) serves many requests at
    # once; each borrows a connection from a per-process pool for the request's duration.
    # A request that waits longer than DB_POOL_TIMEOUT for one answers 503.
    # "default" (the locked path: joins, revocations, admin) gets few: its transactions
    # queue on a group's row lock, and every greenlet inside one slows the lock holder
    # (cooperative scheduling), so waiting for a pooled connection is the cheaper queue.
    # "liveness" (the lock-free steady heartbeat) gets more.
    _POOL_SIZES = {"default": env_int("DB_POOL_DEFAULT_MAX_SIZE", 2), "liveness": env_int("DB_POOL_MAX_SIZE", 4)}
    for _name, _db in DATABASES.items():
        # Django's backend with a pool that answers 503 at once while the database refuses or
        # drops connections, instead of after DB_POOL_TIMEOUT (coordinator_project.postgresql).
        _db["ENGINE"] = "coordinator_project.postgresql"
        _db["CONN_MAX_AGE"] = 0  # Django's pool requires it: the pool keeps them open
        _db["OPTIONS"] = {**_db["OPTIONS"], "pool": {
            "min_size": _POOL_SIZES[_name],  # opened full: no growth under a burst
            "max_size": _POOL_SIZES[_name],
            # A queue for the connection (bursts of joins wait here, not in the listen backlog as
            # with sync workers). With the database down, the 503 comes at once (FailFastPool).
            "timeout": float(os.environ.get("DB_POOL_TIMEOUT", 15)),
        }}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis / Celery -----------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Issue 8.8: a beat tick (or any publish) that falls inside a Redis restart — connection
# refused, then "Redis is loading the dataset in memory" (BusyLoadingError) — is retried for
# up to ~30 s instead of dropped with a traceback. Two layers retry: kombu's (re)connection
# when the channel is opened (transport options, else it gives up after the 4 s connect
# timeout) and the publish itself (task_publish_retry_policy).
_BROKER_RETRY = {"max_retries": 30, "interval_start": 0, "interval_step": 0.5, "interval_max": 1.0}
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = _BROKER_RETRY
CELERY_BROKER_TRANSPORT_OPTIONS = {**_BROKER_RETRY, "connect_retries_timeout": 30, "socket_connect_timeout": 2}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "celery")  # several deployments on one Redis
SWEEP_INTERVAL_SECONDS = float(os.environ.get("SWEEP_INTERVAL_SECONDS", "2"))
# Issue 8.1: web workers stamp the intake beacon this often; a longer gap than
# INTAKE_MAX_GAP_SECONDS is an outage, after which L1/L2 give every member a fresh session.
INTAKE_BEACON_SECONDS = float(os.environ.get("INTAKE_BEACON_SECONDS", "1"))
INTAKE_MAX_GAP_SECONDS = float(os.environ.get("INTAKE_MAX_GAP_SECONDS", max(5.0, 5 * INTAKE_BEACON_SECONDS)))
# Issue 27.3: each stamp first takes the table locks a heartbeat needs (members.intake.probe_
# heartbeat_tables, also /readyz); not granted within this long, the intake counts as down.
INTAKE_PROBE_LOCK_TIMEOUT_MS = int(os.environ.get("INTAKE_PROBE_LOCK_TIMEOUT_MS", "1000"))

# --- Admin logins (issue 27.2, docs/SECURITY.md "Admin login protection") -------
# Django's full set of validators (createsuperuser, changepassword, the admin's password forms).
ADMIN_PASSWORD_MIN_LENGTH = env_int("ADMIN_PASSWORD_MIN_LENGTH", 12)
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": ADMIN_PASSWORD_MIN_LENGTH}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# PBKDF2 derivation off the gevent loop, in ADMIN_HASH_THREADS OS threads per web worker at nice
# ADMIN_HASH_THREAD_NICE (coordinator_project.admin_login). The other hashers verify old hashes.
PASSWORD_HASHERS = [
    "coordinator_project.admin_login.OffLoopPBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]
ADMIN_HASH_THREADS = env_int("ADMIN_HASH_THREADS", 2)
ADMIN_HASH_THREAD_NICE = env_int("ADMIN_HASH_THREAD_NICE", 10)
# Throttling (django-axes): after LOGIN_FAILURE_LIMIT failed logins for one username, or from
# one client address (REMOTE_ADDR: behind a proxy, see SECURITY.md), further logins for it are
# refused with 429 for LOGIN_COOLOFF_MINUTES (0: until an operator resets it with
# manage.py axes_reset_username / axes_reset_ip / axes_reset). Attempts are kept in the
# database (shared by every worker and host) and shown in the admin ("Access attempts").
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10)
LOGIN_COOLOFF_MINUTES = float(os.environ.get("LOGIN_COOLOFF_MINUTES", "15"))
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before any hash
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = (LOGIN_COOLOFF_MINUTES / 60) or None  # hours; None: until reset
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one locks: per account, per address
AXES_LOCKOUT_CALLABLE = "coordinator_project.admin_login.lockout_response"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# One line per failed login and per lockout comes from coordinator_project.admin_login
# (throttled per address); axes' own per-attempt lines would repeat them unthrottled.
_AXES_LOG_LEVEL = "ERROR"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on a missing root
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "coordinator_project.staticfiles.CompressedOnceStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["groups.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["groups.api_parsers.BoundedJSONParser"],  # size + depth bounds
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "groups.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Redis Stream Coordinator API",
    "DESCRIPTION": "Control plane for sharded Redis Stream consumer groups (see docs/).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Operation ids and tags as published ("v1_groups_heartbeat_create", tag "v1"): the prefix
    # they leave out, stated rather than guessed from the paths the URLconf holds (without the
    # schema's own /api/schema/, SERVE_API_SCHEMA=0, the guess was /api/v1/ and every id changed).
    "SCHEMA_PATH_PREFIX": r"/api/",
}

LOG_FORMAT = os.environ.get("LOG_FORMAT", "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "coordinator_project.logging.TextFormatter",
                 "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "coordinator_project.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT if LOG_FORMAT in {"text", "json"} else "text"},
    },
    # Lines any client can cause at will (4xx, a bad Host header): one per kind per 10 s.
    "filters": {"refusals": {"()": "coordinator_project.logging.RefusalThrottle"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"},
        "axes": {"level": _AXES_LOG_LEVEL},
        **{name: {"filters": ["refusals"]} for name in REFUSAL_LOGGERS},
    },
}

# --- Periodic sweeps and resharding -------------------------------------------
# Where the shard streams live; seal markers are written here (§6.2).
STREAM_REDIS_URL = os.environ.get("STREAM_REDIS_URL", REDIS_URL)
# Every sweep is safe to overlap, so a tick that waited longer than a few intervals is
# dropped rather than run late (the next tick does the same work).
_SWEEP_OPTIONS = {"expires": max(SWEEP_INTERVAL_SECONDS * 3, 1.0)}
CELERY_BEAT_SCHEDULE = {
    "sweep-liveness": {  # L1 session expiry + L2 rebalance timeout
        "task": "members.tasks.sweep_liveness",
        "schedule": SWEEP_INTERVAL_SECONDS,
        "options": _SWEEP_OPTIONS,
    },
    "advance-resharding": {  # §6 seal and retire
        "task": "groups.tasks.advance_resharding",
        "schedule": SWEEP_INTERVAL_SECONDS,
        "options": _SWEEP_OPTIONS,
    },
}

# Join batching (coordination.engine.r1b_defer_rebalance): joins and leaves within
# this many ms of a target recompute (or the first join of an empty group) wait for one
# recompute at the window's end; 0 recomputes on every join and leave.
RSC_REBALANCE_WINDOW_MS = env_int("RSC_REBALANCE_WINDOW_MS", 1000)

# --- Admin and observability --------------------------------------------------
# /readyz fails when a recorded sweep has not finished for this long (L1/L2 stall).
SWEEP_MAX_LAG_SECONDS = float(os.environ.get("SWEEP_MAX_LAG_SECONDS", max(30.0, 10 * SWEEP_INTERVAL_SECONDS)))
# Optional bearer token for /metrics (empty: open, as usual behind a private scrape network).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
# /api/schema/ and /api/docs/ (the OpenAPI contract, no installation data): served unless 0.
# What is open by default and why: docs/SECURITY.md "Endpoints without a key".
SERVE_API_SCHEMA = env_bool("SERVE_API_SCHEMA", True)

# --- Hardening: shard cap, retention, join rate limits -----------------------
# Most shards a stream version may have (create_stream, reshard); hard ceiling 16,384.
MAX_SHARDS_PER_STREAM = env_int("MAX_SHARDS_PER_STREAM", 1024)
# Retention (groups.retention, beat task `groups.tasks.apply_retention`). LEFT, EXPIRED and
# FENCED member rows last heard more than this long ago (and longer ago than the group's
# session timeout) are deleted; events older than EVENT_RETENTION_DAYS. 0 keeps them forever.
MEMBER_TOMBSTONE_RETENTION_SECONDS = env_int("MEMBER_TOMBSTONE_RETENTION_SECONDS", 86_400)
EVENT_RETENTION_DAYS = env_int("EVENT_RETENTION_DAYS", 30)
# Count caps per group, applied by the same pass: beyond them the oldest tombstones (never
# one heard within the group's session timeout) and the oldest events go. 0: no cap.
MAX_TOMBSTONES_PER_GROUP = env_int("MAX_TOMBSTONES_PER_GROUP", 10_000)
MAX_EVENTS_PER_GROUP = env_int("MAX_EVENTS_PER_GROUP", 100_000)
# A stream's own events (no group: reshard steps, stream key events) per stream, the same way.
MAX_EVENTS_PER_STREAM = env_int("MAX_EVENTS_PER_STREAM", 100_000)
RETENTION_INTERVAL_SECONDS = float(os.environ.get("RETENTION_INTERVAL_SECONDS", "300"))
CELERY_BEAT_SCHEDULE["apply-retention"] = {
    "task": "groups.tasks.apply_retention",
    "schedule": RETENTION_INTERVAL_SECONDS,
    "options": {"expires": RETENTION_INTERVAL_SECONDS},
}
# Joins (memberEpoch 0) per web worker process: a token bucket per API key and per client
# address (REMOTE_ADDR; behind a proxy that is the proxy's). Rate 0 turns a limit off.
JOIN_RATE_PER_KEY = float(os.environ.get("JOIN_RATE_PER_KEY", "50"))
JOIN_BURST_PER_KEY = env_int("JOIN_BURST_PER_KEY", 1000)
JOIN_RATE_PER_IP = float(os.environ.get("JOIN_RATE_PER_IP", "0"))
JOIN_BURST_PER_IP = env_int("JOIN_BURST_PER_IP", 100)
# Leaves (memberEpoch -1, -2) the same way, in buckets of their own (a rolling restart's leaves
# do not use up its rejoins): join/leave churn from one key is bounded both ways. Default: as joins.
LEAVE_RATE_PER_KEY = float(os.environ.get("LEAVE_RATE_PER_KEY", str(JOIN_RATE_PER_KEY)))
LEAVE_BURST_PER_KEY = env_int("LEAVE_BURST_PER_KEY", JOIN_BURST_PER_KEY)
LEAVE_RATE_PER_IP = float(os.environ.get("LEAVE_RATE_PER_IP", str(JOIN_RATE_PER_IP)))
LEAVE_BURST_PER_IP = env_int("LEAVE_BURST_PER_IP", JOIN_BURST_PER_IP)
# Failed API-key lookups per client address and web worker (issue 27.10): a key no cache knows
# costs a database query; after AUTH_FAILURE_BURST_PER_IP lookups that found no key, refilled at
# AUTH_FAILURE_RATE_PER_IP a second, such keys from that address get 429 RATE_LIMITED with
# Retry-After and no query. Keys already cached pass. Rate 0 turns the limit off.
AUTH_FAILURE_RATE_PER_IP = float(os.environ.get("AUTH_FAILURE_RATE_PER_IP", "2"))
AUTH_FAILURE_BURST_PER_IP = env_int("AUTH_FAILURE_BURST_PER_IP", 20)
# --- Operator visibility (PROTOCOL.md §10) ------------------------------------
# The shard streams are on a Redis Cluster (per-node pipelines for the shard statistics).
STREAM_REDIS_CLUSTER = os.environ.get("STREAM_REDIS_CLUSTER", "").lower() in {"1", "true", "yes"}
# Lag/pending/DLQ figures are cached per process this long (one round trip per node per period).
SHARD_STATS_CACHE_SECONDS = float(os.environ.get("SHARD_STATS_CACHE_SECONDS", "2"))
SHARD_STATS_SOCKET_TIMEOUT = float(os.environ.get("SHARD_STATS_SOCKET_TIMEOUT", "0.5"))
# Null-lag fallback counts at most this many entries per shard (beyond: a lower bound).
SHARD_STATS_XRANGE_LIMIT = int(os.environ.get("SHARD_STATS_XRANGE_LIMIT", "1000"))
# Past the cache time, figures up to this much older are served while one background read
# refreshes them (0: callers wait for the read).
SHARD_STATS_STALE_SECONDS = float(os.environ.get("SHARD_STATS_STALE_SECONDS", "3"))
# /metrics: per-shard series (rsc_shard_lag, rsc_shard_pending) only for groups whose stream has
# at most this many live shards (beyond, the group totals alone: 16,384 shards would be 32,768
# series per group and scrape); 0 = always.
METRICS_SHARD_SERIES_MAX_SHARDS = env_int("METRICS_SHARD_SERIES_MAX_SHARDS", 4096)
# The admin shows times to the second (coordinator_project/formats/en/formats.py).
FORMAT_MODULE_PATH = ["coordinator_project.formats"]
