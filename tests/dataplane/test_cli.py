"""``python -m dataplane`` route / produce / consume, as subprocesses."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dataplane import Producer
from dataplane.routing import ShardKeys, hash64, shard_index
from tests import spawn

from .conftest import ROOT, routing_doc, version_doc, wait_until


def env(coordinator_url: str, redis_url: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update(
        RSC_COORDINATOR_URL=coordinator_url,
        RSC_API_KEY="cli-key",
        REDIS_URL=redis_url,
        PYTHONPATH=str(ROOT),
    )
    return e


def run(args: list[str], e: dict[str, str], cwd: Path | None = None):
    return spawn.run(
        [sys.executable, "-m", "dataplane", *args],
        env=e,
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def setup_stream(coordinator, prefix: str) -> None:
    versions = [version_doc("orders", 1, 4, prefix)]
    coordinator.routing = routing_doc("orders", prefix, *versions, write=1)
    coordinator.metadata = {
        "metadataEpoch": 1,
        "group": "g",
        "stream": "orders",
        "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": 30000,
        "startPosition": "earliest",
        "keyPrefix": prefix,
        "versions": versions,
    }


def test_route_and_produce(r, prefix, coordinator, redis_url) -> None:
    setup_stream(coordinator, prefix)
    e = env(coordinator.url, redis_url)
    out = run(["route", "--stream", "orders", "user-1"], e)
    assert out.returncode == 0, out.stderr
    shard = f"orders:1:{shard_index(hash64('user-1'), 4)}"
    assert json.loads(out.stdout) == {
        "shard": shard,
        "redisKey": f"{prefix}:{{{shard}}}",
        "version": 1,
    }
    out = run(["produce", "--stream", "orders", "--key", "user-1", "a=1", "b=x=y"], e)
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    assert sent["shard"] == shard
    assert r.xrange(ShardKeys(shard, prefix).stream) == [
        (sent["id"], {"key": "user-1", "a": "1", "b": "x=y"})
    ]
    assert coordinator.auth[-1] == "Bearer cli-key"


def test_clear_errors(coordinator, redis_url) -> None:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RSC_")}
    e["PYTHONPATH"] = str(ROOT)
    out = run(["route", "--stream", "orders", "k"], e)
    assert out.returncode == 2
    assert "--coordinator or $RSC_COORDINATOR_URL" in out.stderr
    e = env(coordinator.url, redis_url)
    out = run(["produce", "--stream", "orders", "--key", "k", "novalue"], e)
    assert out.returncode == 2
    assert "name=value" in out.stderr
    out = run(["consume", "--group", "g", "--handler", "nosuchmodule:fn"], e)
    assert out.returncode == 2
    assert "cannot load handler" in out.stderr
    # i24.8: a path instead of module:function says so, not a TypeError from importlib.
    out = run(["consume", "--group", "g", "--handler", "./handlers/orders.py:handle"], e)
    assert out.returncode == 2
    assert "not a path" in out.stderr
    assert "--handler handlers.orders:handle" in out.stderr
    assert "TypeError" not in out.stderr


def test_consume_until_sigterm_then_leave(r, prefix, coordinator, redis_url, tmp_path) -> None:
    """Also issue 25's bench premise: the handler runs after `consume` froze the collector
    (gc.freeze() once start-up is done), so the process the CLI owns pays no full passes over
    what start-up loaded."""
    setup_stream(coordinator, prefix)
    seen = tmp_path / "seen.txt"
    frozen = tmp_path / "frozen.txt"
    (tmp_path / "myhandler.py").write_text(
        "import gc\n"
        f"def handle(msg):\n    open({str(seen)!r}, 'a').write(msg.key + '\\n')\n"
        f"    open({str(frozen)!r}, 'w').write(str(gc.get_freeze_count()))\n"
    )
    e = env(coordinator.url, redis_url)
    with Producer(coordinator.url, "orders", "cli-key", redis_url=redis_url) as p:
        p.send_many([(f"k{i}", {"n": "1"}) for i in range(20)])
    proc = spawn.Popen(
        [
            sys.executable,
            "-m",
            "dataplane",
            "consume",
            "--group",
            "g",
            "--handler",
            "myhandler:handle",
            "--member-id",
            "cli-member",
            "--block-ms",
            "100",
        ],
        env=e,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: seen.exists() and len(seen.read_text().split()) >= 20,
            timeout=30,
            what="consumed",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(seen.read_text().split()) == sorted(f"k{i}" for i in range(20))
    assert int(frozen.read_text()) > 1000  # start-up's objects, out of the collector's passes
    assert coordinator.requests[0]["memberEpoch"] == 0
    assert coordinator.requests[-1]["memberEpoch"] == -1


def test_installed_console_script_runs_from_any_directory_and_finds_a_local_handler(
    tmp_path,
) -> None:
    """`make install` (pip install -e ./dataplane) puts `rsc-dataplane` next to this Python;
    run from a directory outside the repository, without PYTHONPATH."""
    script = Path(sys.executable).parent / "rsc-dataplane"
    if not script.exists():
        pytest.skip(f"{script} not installed: `make install` installs it")
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RSC_API_KEY")}
    (tmp_path / "localhandler.py").write_text("def handle(msg):\n    pass\n")

    def run_here(*argv: str) -> subprocess.CompletedProcess[str]:
        return spawn.run(argv, env=e, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    out = run_here(sys.executable, "-m", "dataplane", "--help")
    assert out.returncode == 0, out.stderr
    assert "exit codes:" in out.stdout, out.stderr
    base = [str(script), "consume", "--coordinator", "http://127.0.0.1:9", "--group", "g"]
    base += ["--api-key", "k", "--redis", "redis://127.0.0.1:9/0", "--handler"]
    # The local handler imports (so the coordinator check is reached: unreachable, exit 3) ...
    out = run_here(*base, "localhandler:handle")
    assert out.returncode == 3, out.stderr
    assert out.stderr.startswith("error: cannot reach the coordinator at http://127.0.0.1:9")
    # ... and a missing one is a configuration error.
    out = run_here(*base, "nothere:handle")
    assert out.returncode == 2
    assert "cannot load handler 'nothere:handle'" in out.stderr


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    """Every (command path, action) of the parser and its subcommands, recursively."""
    out: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{name} {p}".strip(), a) for p, a in _flags(sub)]
        else:
            out.append(("", action))
    return out


def test_i25_5_every_cli_flag_has_help_text() -> None:
    from dataplane.cli import build_parser

    flags = _flags(build_parser())
    assert len(flags) > 40  # the walk reached the subcommands
    missing = [f"{cmd}: {a.option_strings or a.dest}" for cmd, a in flags if not a.help]
    assert missing == []


def test_i25_7_version_is_the_distributions_and_printed_by_version_flag() -> None:
    from importlib.metadata import version

    import dataplane

    assert version("rsc-dataplane") == dataplane.__version__
    out = run(["--version"], dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"python -m dataplane {dataplane.__version__}"


def test_i25_7_heartbeats_carry_the_library_version_in_user_agent(
    prefix, coordinator, redis_url
) -> None:
    import dataplane
    from dataplane import Consumer

    setup_stream(coordinator, prefix)
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100)
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(lambda: len(coordinator.user_agents) >= 2, what="heartbeats")
    finally:
        c.stop()
        t.join(15)
    agent = coordinator.user_agents[0] or ""
    assert agent.startswith(f"rsc-dataplane/{dataplane.__version__} python/"), agent


def test_i25_7_every_public_name_has_a_docstring_and_the_package_is_typed() -> None:
    import inspect

    import dataplane

    undocumented = []
    for name in dataplane.__all__:
        obj = getattr(dataplane, name)
        if not callable(obj):
            continue  # a constant (HASH_ALGORITHM): documented in the module
        doc = (obj.__doc__ or "").strip()
        if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")):
            undocumented.append(name)  # none, or only the one dataclasses/NamedTuple write
    assert undocumented == []
    assert (ROOT / "dataplane" / "py.typed").exists()


def test_i24_8_consume_with_v_keeps_redis_py_debug_lines_out() -> None:
    import logging

    from dataplane.cli import _configure_logging

    _configure_logging("consume", 1)
    assert not logging.getLogger("redis").isEnabledFor(logging.DEBUG)  # MAINT_NOTIFICATIONS lines
    _configure_logging("consume", 2)
    assert logging.getLogger("redis").isEnabledFor(logging.DEBUG)
    logging.getLogger("redis").setLevel(logging.NOTSET)
