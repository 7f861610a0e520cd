"""Command line: ``python -m dataplane consume|produce|route|dlq|status`` (PROTOCOL.md §7.1), also
installed as ``rsc-dataplane``. One module per subcommand, each with ``add_parser``, the flags
it ``NEEDS`` and ``run``; what they share is in ``common``.

Each command first checks its configuration (the coordinator accepts the key for the group or
stream; Redis answers PING) and ends with one line on stderr and a documented exit code when
it cannot start (``common.EPILOG``); only then does it start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..preflight import EXIT_CONFIG, EXIT_UNREACHABLE, PreflightError
from . import consume, dlq, produce, route, status
from .common import EPILOG, resolve

COMMANDS = {"consume": consume, "produce": produce, "route": route, "dlq": dlq, "status": status}


def build_parser() -> argparse.ArgumentParser:
    script = os.path.basename(sys.argv[0]) == "rsc-dataplane"  # the console script
    parser = argparse.ArgumentParser(
        prog="rsc-dataplane" if script else "python -m dataplane",
        description="Redis Stream Coordinator member data-plane",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def _configure_logging(command: str, verbose: int) -> None:
    # The member's own lifecycle (grants, revocations, drains, fences, rejoins) at INFO; the
    # per-request HTTP lines of httpx only with -v.
    # consume: INFO by default; produce/route/dlq print their result, so their stderr stays quiet.
    quiet = logging.INFO if command == "consume" else logging.WARNING
    logging.basicConfig(
        level=quiet - 10 * min(verbose, 1),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.INFO if verbose else logging.WARNING)
    # redis-py logs every connection's MAINT_NOTIFICATIONS handshake at DEBUG: only with -vv
    # (the demo members of make run run with -v and printed it over and over; issue 24.8).
    logging.getLogger("redis").setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
    logging.getLogger("httpcore").setLevel(logging.DEBUG if verbose > 1 else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.command, args.verbose)
    from ..errors import ConfigurationError, RedisUnavailableError
    from ..transport import CoordinatorError, CoordinatorUnavailable

    command = COMMANDS[args.command]
    try:
        resolve(args, parser, *command.NEEDS)
        return command.run(args, parser)
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except RedisUnavailableError as exc:  # Consumer.run() before its first join
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ConfigurationError as exc:  # refused key or unknown group before the first join,
        # or InstanceIdReplaced (another process joined with our --instance-id) at any time
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CoordinatorError as exc:
        print(f"error: coordinator refused: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CoordinatorUnavailable as exc:
        print(f"error: coordinator unavailable: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


__all__ = ["build_parser", "main"]
