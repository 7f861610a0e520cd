"""Settings, all from the environment (see README "Configuration")."""
from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


DEBUG = env_bool("DEBUG", False)
# A fixed insecure key only when DEBUG is on, so production must set SECRET_KEY.
SECRET_KEY = os.environ.get("SECRET_KEY") or ("dev-insecure-key" if DEBUG else "")
if not SECRET_KEY:
    SECRET_KEY = "unset-" + os.urandom(16).hex()  # sessions won't survive restarts: set SECRET_KEY
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "groups",
    "members",
    "assignments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
if _default["ENGINE"].endswith("postgresql"):
    # Liveness-only writes (steady-state heartbeats) go through a second connection whose
    # commits do not wait for fsync: losing a last-seen stamp in a crash costs nothing, and
    # fsync stalls here reach hundreds of ms. Ownership changes stay on "default".
    _liveness = dict(_default)
    # Server-side binding + prepare_threshold let psycopg prepare the steady-state statement
    # after a few runs: planning it cost ~0.6 ms of ~0.85 ms per heartbeat (bench/heartbeat.py).
    _liveness["OPTIONS"] = {
        **_default.get("OPTIONS", {}),
        "options": "-c synchronous_commit=off",
        "server_side_binding": True,
        "prepare_threshold": 2,
    }
    _liveness["TEST"] = {"MIRROR": "default"}
    _liveness["CONN_HEALTH_CHECKS"] = False  # fastpath drops a broken connection itself
    DATABASES["liveness"] = _liveness
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis / Celery -----------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
SWEEP_INTERVAL_SECONDS = float(os.environ.get("SWEEP_INTERVAL_SECONDS", "2"))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on a missing root
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["groups.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
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
}

LOG_FORMAT = os.environ.get("LOG_FORMAT", "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "coordinator_project.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT if LOG_FORMAT in {"text", "json"} else "text"},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- Periodic sweeps and resharding (issue 3) ---------------------------------
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

# --- Admin and observability (issue 5) ----------------------------------------
# /readyz fails when a recorded sweep has not finished for this long (L1/L2 stall).
SWEEP_MAX_LAG_SECONDS = float(os.environ.get("SWEEP_MAX_LAG_SECONDS", max(30.0, 10 * SWEEP_INTERVAL_SECONDS)))
# Optional bearer token for /metrics (empty: open, as usual behind a private scrape network).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")

# --- Operator visibility (issue 10, PROTOCOL.md §10) ---------------------------
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
# The admin shows times to the second (coordinator_project/formats/en/formats.py).
FORMAT_MODULE_PATH = ["coordinator_project.formats"]
