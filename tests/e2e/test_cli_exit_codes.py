"""Issue 12.3: the CLI fails clearly, with the documented exit codes, against the real
coordinator (gunicorn on PostgreSQL) and real Redis: each misuse ends at start-up with ONE line
on stderr (no traceback) and exit 2 (refused: fix the configuration) or 3 (unreachable).
Every command runs as a subprocess from a temporary directory, not the repository root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from groups.services import create_api_key, create_group, create_stream
from tests.ports import refused_port

from .cli import one_line, run_cli
from .conftest import World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

HANDLER = "def handle(msg):\n    pass\n"


def consume(world: World, *extra: str, key: str | None = None, group: str | None = None,
            redis_url: str | None = None, handler: str = "myhandler:handle") -> list[str]:
    return [
        "consume", "--coordinator", world.server.url, "--group", group or world.group,
        "--redis", redis_url or world.redis_url, "--handler", handler,
        *(["--api-key", key] if key is not None else []), *extra,
    ]


def test_cli_consume_misconfigured_fails_at_start_with_one_line_and_exit_2_or_3(world: World, tmp_path: Path) -> None:
    world.create(2)
    (tmp_path / "myhandler.py").write_text(HANDLER)
    create_stream(f"other-{world.uid}", 1, key_prefix=world.prefix)
    create_group(f"other-{world.uid}", f"other-{world.uid}")
    other_key = create_api_key(group=f"other-{world.uid}")

    # Unknown API key: 401, the line names the key problem and where the key comes from.
    out = run_cli(consume(world, key="not-a-key"), tmp_path)
    line = one_line(out)
    assert out.returncode == 2, out.stderr
    assert line.startswith("error: the API key is missing, unknown or revoked"), line
    assert "HTTP 401 AUTHENTICATION_FAILED" in line
    assert "--api-key-file" in line
    assert "consuming" not in out.stderr

    # No key at all: a usage error (argparse, exit 2) naming the three sources.
    out = run_cli(consume(world), tmp_path)
    assert out.returncode == 2
    assert "--api-key, --api-key-file or $RSC_API_KEY is required" in out.stderr

    # A key of another group: 403.
    out = run_cli(consume(world, key=other_key), tmp_path)
    line = one_line(out)
    assert out.returncode == 2
    assert f"the API key does not grant access to group {world.group!r}" in line
    assert "HTTP 403 AUTHORIZATION_FAILED" in line

    # Unknown group (with a valid key of another group): 404.
    out = run_cli(consume(world, key=world.group_key, group="no-such-group"), tmp_path)
    line = one_line(out)
    assert out.returncode == 2
    assert "group 'no-such-group' does not exist on the coordinator" in line
    assert "HTTP 404 GROUP_ID_NOT_FOUND" in line

    # Redis unreachable: exit 3, one line naming the URL (password redacted).
    with refused_port() as port:
        out = run_cli(consume(world, key=world.group_key,
                              redis_url=f"redis://:secret@127.0.0.1:{port}/0"), tmp_path)
    line = one_line(out)
    assert out.returncode == 3, out.stderr
    assert line.startswith(f"error: cannot reach Redis at redis://:***@127.0.0.1:{port}/0:"), line
    assert "secret" not in out.stderr

    # Not a Redis URL at all: a configuration error.
    out = run_cli(consume(world, key=world.group_key, redis_url="http://127.0.0.1:6379"), tmp_path)
    assert out.returncode == 2, out.stderr
    assert one_line(out).startswith("error: bad Redis URL"), out.stderr

    # Coordinator unreachable: exit 3.
    with refused_port() as port:
        out = run_cli(["consume", "--coordinator", f"http://127.0.0.1:{port}",
                       "--group", world.group, "--api-key", world.group_key, "--redis", world.redis_url,
                       "--handler", "myhandler:handle"], tmp_path)
    assert out.returncode == 3
    assert one_line(out).startswith("error: cannot reach the coordinator at http://127.0.0.1:")

    # Bad handler specs: exit 2, one line each, before anything contacts the coordinator.
    (tmp_path / "broken.py").write_text("def handle(msg) pass\n")
    for spec, says in [
        ("myhandler", "--handler must look like module:function"),
        ("no_such_module:handle", "ModuleNotFoundError: No module named 'no_such_module'"),
        ("myhandler:nope", "AttributeError"),
        ("broken:handle", "SyntaxError"),
    ]:
        out = run_cli(consume(world, key=world.group_key, handler=spec), tmp_path)
        line = one_line(out)
        assert out.returncode == 2, (spec, out.stderr)
        assert line.startswith(f"error: cannot load handler {spec!r}"), line
        assert says in line, line

    # A bad member id (the library's own check) is a configuration error too.
    out = run_cli(consume(world, "--member-id", "bad id!", key=world.group_key), tmp_path)
    assert out.returncode == 2
    assert "member_id must be" in one_line(out)


def test_cli_produce_route_and_key_sources_fail_clearly_and_read_json_lines(world: World, tmp_path: Path) -> None:
    world.create(2)
    base = ["--coordinator", world.server.url, "--stream", world.stream]

    out = run_cli(["route", *base, "--api-key", "wrong", "k"], tmp_path)
    assert out.returncode == 2
    assert "HTTP 401" in one_line(out)
    out = run_cli(["route", "--coordinator", world.server.url, "--stream", "nope",
                   "--api-key", world.stream_key, "k"], tmp_path)
    assert out.returncode == 2
    assert one_line(out).startswith("error: stream 'nope' does not exist on the coordinator")
    with refused_port() as port:
        out = run_cli(["produce", *base, "--redis", f"redis://127.0.0.1:{port}/0",
                       "--api-key", world.stream_key, "--key", "k", "a=1"], tmp_path)
    assert out.returncode == 3
    assert one_line(out).startswith("error: cannot reach Redis")

    # The key from a file or from $RSC_API_KEY: it never appears on the command line.
    key_file = tmp_path / "key"
    key_file.write_text(world.stream_key + "\n")
    lines = [f'{{"key": "k{i}", "n": {i}, "ok": true, "note": "x y"}}' for i in range(1200)]
    stdin = "\n".join(lines[:700]) + "\n\n" + "\n".join(lines[700:]) + "\n"
    out = run_cli(["produce", *base, "--redis", world.redis_url, "--api-key-file", str(key_file),
                   "--batch-size", "500"], tmp_path, stdin=stdin)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{"sent": 1200}'
    entries = [f for s in world.shard_ids() for _id, f in world.r.xrange(world.keys(s).stream)]
    assert len(entries) == 1200
    assert {"key": "k7", "n": "7", "ok": "true", "note": "x y"} in entries

    # --key-field names the field holding the key; a bad line stops there, naming the line,
    # after sending the lines before it.
    stdin = '{"user": "u1", "a": "1"}\n{"user": "u2"}\n{"a": "no key"}\n{"user": "u4"}\n'
    out = run_cli(["produce", *base, "--redis", world.redis_url, "--key-field", "user"],
                  tmp_path, stdin=stdin, RSC_API_KEY=world.stream_key)
    assert out.returncode == 2
    assert one_line(out) == ("error: stdin line 3: no 'user' field holding the key (--key-field); "
                             "sent 2 messages before it")
    assert out.stdout.strip() == '{"sent": 2}'
    out = run_cli(["produce", *base, "--redis", world.redis_url, "--api-key", world.stream_key],
                  tmp_path, stdin='{"key": "k", "nested": {"a": 1}}\n')
    assert out.returncode == 2
    assert one_line(out).startswith("error: stdin line 1: field 'nested' must be a string or number")

    # --api-key-file misuse: a usage error.
    out = run_cli(["route", *base, "--api-key-file", str(tmp_path / "missing"), "k"], tmp_path)
    assert out.returncode == 2
    assert "--api-key-file: cannot read" in out.stderr
    out = run_cli(["route", *base, "--api-key", "x", "--api-key-file", str(key_file), "k"], tmp_path)
    assert out.returncode == 2
    assert "mutually exclusive" in out.stderr
