"""What every subcommand of the CLI shares: the connection flags, their environment variables,
the exit codes and the epilog that documents them."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..preflight import EXIT_CONFIG, EXIT_UNREACHABLE

ENV = {"coordinator": "RSC_COORDINATOR_URL", "api_key": "RSC_API_KEY", "redis": "REDIS_URL"}
EXIT_FAILED = 1

EPILOG = f"""\
exit codes:
  0  done (consume: stopped by SIGINT/SIGTERM after leaving the group; status: healthy)
  {EXIT_FAILED}  failed after a successful start (produce/dlq replay: messages not appended);
     status: the member answers but is not healthy
  {EXIT_CONFIG}  refused, fix the configuration: bad arguments, bad --handler, API key missing,
     unknown or revoked (HTTP 401) or not for this group/stream (403), unknown group or
     stream (404), Redis refused the credentials; consume: another process joined
     with the same --instance-id and took this one's place (PROTOCOL §9 R1s), so this one
     stopped instead of replacing it in turn; consume after a successful start: the key
     (401/403) or the group (404) refused for --refusal-timeout with the session lost;
     --redis is not the coordinator's stream Redis (<keyPrefix>:identity missing or another
     installation's) or refuses a command the member needs (ACL)
  {EXIT_UNREACHABLE}  unreachable at start: the coordinator or Redis cannot be reached (status: no
     member answers on --metrics-port)
Errors with exit codes 2 and 3 print one line on stderr, never a traceback. After a
successful start, transient coordinator/Redis errors are retried with a warning.

environment: ${ENV["coordinator"]}, ${ENV["api_key"]} and ${ENV["redis"]} stand in for
--coordinator, --api-key and --redis; --api-key-file or ${ENV["api_key"]} keep the key out
of `ps`.
"""


class InputError(Exception):
    """Bad input that is the caller's to fix (exit 2)."""


def add_common(p: argparse.ArgumentParser, redis: bool = True) -> None:
    p.add_argument("--coordinator", help=f"coordinator base URL (env {ENV['coordinator']})")
    p.add_argument("--api-key", dest="api_key", help=f"API key (env {ENV['api_key']})")
    p.add_argument(
        "--api-key-file",
        dest="api_key_file",
        metavar="PATH",
        help="read the API key from this file (keeps it out of `ps`)",
    )
    if redis:
        p.add_argument("--redis", help=f"Redis URL (env {ENV['redis']})")
        p.add_argument("--cluster", action="store_true", help="Redis is a Redis Cluster")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more logging: -v shows debug lines and each HTTP request, -vv also the HTTP wire",
    )


def add_sub(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser, *names: str) -> None:
    """Fill flags from the environment (the API key also from --api-key-file); usage error
    when one is still missing."""
    for name in names:
        if name == "api_key" and not args.api_key and args.api_key_file:
            args.api_key = _read_key_file(args.api_key_file, parser)
        elif name == "api_key" and args.api_key and args.api_key_file:
            parser.error("--api-key and --api-key-file are mutually exclusive")
        if not getattr(args, name, None):
            setattr(args, name, os.environ.get(ENV[name]))
        if not getattr(args, name):
            flag = "--" + name.replace("_", "-")
            extra = ", --api-key-file" if name == "api_key" else ""
            parser.error(f"{args.command}: {flag}{extra} or ${ENV[name]} is required")


def _read_key_file(path: str, parser: argparse.ArgumentParser) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        parser.error(f"--api-key-file: cannot read {path}: {exc.strerror or exc}")
    if not key or len(key.split()) != 1:
        parser.error(f"--api-key-file: {path} must hold exactly one key")
    return key
