"""The suite's process launcher (tests/spawn.py): a program forked from the zygote behaves as
the same program started by a new interpreter, as far as a test can see."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import spawn

SCRIPT = """\
import atexit, os, sys, threading, time
print(__name__, os.path.basename(sys.argv[0]), sys.argv[1:], os.getcwd() == os.environ["EXPECT_CWD"],
      os.environ.get("ONLY_HERE"), "DJANGO_SETTINGS_MODULE" in os.environ)
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
sys.exit(int(sys.argv[1]))
"""


def _both(args: list[str], **kwargs: object) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    new = subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs)  # type: ignore[call-overload]
    forked = spawn.run(args, capture_output=True, text=True, timeout=60, **kwargs)
    return new, forked


def test_a_script_sees_its_argv_cwd_env_and_exits_as_from_a_new_interpreter(tmp_path: Path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "EXPECT_CWD": str(tmp_path), "ONLY_HERE": "yes"}
    new, forked = _both([sys.executable, str(script), "3", "x"], cwd=tmp_path, env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (new.returncode, new.stdout, new.stderr)
    assert forked.returncode == 3
    assert forked.stdout.splitlines() == ["__main__ prog.py ['3', 'x'] True yes " + str("DJANGO_SETTINGS_MODULE" in env),
                                          "thread joined", "atexit ran"]


def test_an_uncaught_exception_and_a_module_run_as_main_match_a_new_interpreter(tmp_path: Path):
    new, forked = _both([sys.executable, "-c", "import sys; print(sys.argv); raise ValueError('boom')", "a"])
    assert forked.returncode == new.returncode == 1
    assert forked.stdout == new.stdout == "['-c', 'a']\n"
    assert forked.stderr.splitlines()[-1] == new.stderr.splitlines()[-1] == "ValueError: boom"
    data = tmp_path / "in.json"
    data.write_text('{"b": 1, "a": [1, 2]}')
    new, forked = _both([sys.executable, "-m", "json.tool", "--sort-keys", str(data)])
    assert (forked.returncode, forked.stdout) == (new.returncode, new.stdout) == (0, new.stdout)
    assert '"a": [' in forked.stdout


@pytest.mark.skipif(os.environ.get("RSC_TEST_ZYGOTE") == "0", reason="RSC_TEST_ZYGOTE=0: no zygote")
def test_the_zygote_runs_it_in_a_session_of_its_own_and_signals_reach_it():
    proc = spawn.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert isinstance(proc, spawn.ZygoteProcess)  # not a fallback to subprocess
        assert os.getpgid(proc.pid) == proc.pid
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        proc.kill()


def test_input_and_a_timeout_work_as_with_subprocess():
    done = spawn.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], input="hello",
                     capture_output=True, text=True, timeout=60)
    assert done.stdout == "HELLO\n"
    with pytest.raises(subprocess.TimeoutExpired):
        spawn.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_what_only_a_new_interpreter_reproduces_goes_to_subprocess():
    # Interpreter flags, another executable, gevent's patching, a setting read at start-up,
    # gunicorn without the shipped config (which patches before the app loads).
    procs = [
        spawn.Popen([sys.executable, "-u", "-c", "pass"]),
        spawn.Popen(["true"]),
        spawn.Popen([sys.executable, "-c", "import gevent"]),
        spawn.Popen([sys.executable, "-c", "pass"], env={**os.environ, "PYTHONHASHSEED": "1"}),
        spawn.Popen([sys.executable, "-c", "pass"], env={**os.environ, "GEVENT_RESOLVER": "block"}),
        spawn.Popen([sys.executable, "-m", "gunicorn", "--version"], stdout=subprocess.DEVNULL),
    ]
    # What the zygote cannot honour, asked for by an argument.
    procs.append(spawn.Popen([sys.executable, "-c", "pass"], preexec_fn=os.getpid))
    for proc in procs:
        assert type(proc) is subprocess.Popen, proc.args
        assert proc.wait(30) == 0, proc.args


def test_arguments_at_subprocess_defaults_still_use_the_zygote():
    """`shell=False, executable=None` ask for nothing a zygote does not do: a helper that always
    passes them (test_operator_errors.run) sent every command to a new interpreter."""
    proc = spawn.Popen([sys.executable, "-c", "pass"], shell=False, executable=None, pass_fds=())
    assert isinstance(proc, spawn.ZygoteProcess)
    assert proc.wait(30) == 0


def test_a_child_that_exits_at_once_reports_its_start_and_exit_in_one_read():
    """The zygote sends `P<pid>` when the child has started and `X<status>` when it has been
    reaped; for a child that exits at once both can arrive in one recv. The launcher took the
    two lines for one pid and raised ValueError (seen once in CI, test_operator_errors); the
    exit status must reach the process object, not be lost with the first line."""
    ours, zygote = socket.socketpair()
    with ours, zygote:
        zygote.sendall(b"P7\n")  # the usual case: the start alone
        assert spawn.read_started(ours) == (7, b"")
        zygote.sendall(b"P4242\nX512\n")  # both written before the launcher reads
        pid, early = spawn.read_started(ours)
        assert (pid, early) == (4242, b"X512\n")
        proc = spawn.ZygoteProcess(["x"], ours, pid, None, None, None, early)
        assert proc.poll() == 2  # exit status 2, from the line already read


def test_a_shell_blocks_manage_py_lines_are_forked_from_the_zygote(tmp_path: Path):
    """The docs' shell blocks run in bash as printed; with spawn.shell_prelude their
    `.venv/bin/python manage.py ...` lines are children of the zygote (tests/zygote_client.py),
    with the block's environment, directory, stdio and exit status; nothing else changes."""
    (tmp_path / "manage.py").write_text(
        "import os, sys\nprint(os.getppid(), os.environ['BLOCK_VAR'], sys.argv[1:], os.getcwd())\n"
        "print('to stderr', file=sys.stderr)\nsys.exit(3)\n")
    env = {**os.environ, "BLOCK_VAR": "from-the-block"}
    prelude, needs = spawn.shell_prelude(env)
    assert prelude
    script = prelude + ".venv/bin/python manage.py create_stream 'orders' --shards 8 || echo \"exit $?\""
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env={**env, **needs},
                          capture_output=True, text=True, timeout=60)
    parent, rest = done.stdout.split(" ", 1)
    assert int(parent) == spawn._zygotes["plain"].proc.pid
    assert rest.splitlines() == [f"from-the-block ['create_stream', 'orders', '--shards', '8'] {tmp_path}", "exit 3"]
    assert done.stderr == "to stderr\n"
    # Without the zygote (RSC_TEST_ZYGOTE=0, or an environment it would not reproduce): nothing.
    assert spawn.shell_prelude({**env, "PYTHONHASHSEED": "7"}) == ("", {})


def test_a_forked_child_starts_with_the_zygotes_libraries_frozen_and_the_collector_as_a_new_interpreter():
    """Decision 0019, sixth round: no collector pass of a child walks what the zygote preloaded
    (nor writes to the pages the fork shares); the collector is on, with the thresholds a new
    interpreter has (a gunicorn worker sets its own, decision 0027)."""
    code = "import gc; print(gc.isenabled(), gc.get_freeze_count(), *gc.get_threshold())"
    new, forked = _both([sys.executable, "-c", code])
    enabled, frozen, *thresholds = forked.stdout.split()
    assert new.stdout.split()[:2] == ["True", "0"]
    assert enabled == "True", forked.stdout
    assert int(frozen) > 50_000, forked.stdout
    assert thresholds == new.stdout.split()[2:]


def test_a_forked_child_finds_what_httpx_drf_and_gevent_import_later_already_loaded():
    """Decision 0019, seventh round: httpx imports httpcore (and with it trio, when installed)
    at a client's first transport, DRF imports yaml and drf-spectacular django.test, and the
    coordinator's modules import gevent: each child did that again (~0.1 CPU-s a web worker).
    A new interpreter has none of them; a forked child has them all before it imports anything."""
    # (A `-c` naming gevent goes to subprocess: the zygote would not patch as it asks.)
    code = "import sys; print(*(m in sys.modules for m in ('httpcore', 'yaml', 'django.test', 'gev' + 'ent')))"
    new, forked = _both([sys.executable, "-c", code])
    proc = spawn.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    assert type(proc) is not subprocess.Popen
    assert proc.wait(30) == 0
    assert new.stdout.split() == ["False"] * 4
    assert forked.stdout.split() == ["True"] * 4, forked.stderr
