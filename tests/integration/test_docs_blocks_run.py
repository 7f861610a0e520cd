"""Issue 24.7: the shell and Python blocks of README.md, dataplane/README.md, docs/OPERATING.md,
docs/SECURITY.md and docs/RESHARDING.md marked `<!-- docs-test: run: tests/integration/test_docs_blocks_run.py -->`
run here, read from the docs themselves, against a real stack: a fresh PostgreSQL database
migrated by `manage.py migrate`, real gunicorn with the shipped config, and Redis; the commands
find their settings through RSC_ENV_FILE as an operator's would (the bootstrap's own blocks run
in test_bootstrap.py).

What a block may not know is put in, and the marker says so: the test's port and Redis for
`127.0.0.1:8000`/`coordinator:8000` and `127.0.0.1:6379/0`/`redis:6379/0`; the keys the doc's
own create_api_key lines printed for GROUP-KEY/STREAM-KEY (and $GROUP_KEY, $STREAM_KEY,
$RSC_API_KEY in the environment); a real key prefix for rsc_AbCdEfGh; member m-7f3a joins by a
heartbeat before the block that fences it. A block that consumes until stopped gets SIGTERM once
its member joined, and must then leave the group and exit 0."""
from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests import plain_http, spawn

from .conftest import ROOT, FreshInstall, fresh_install, poll

pytestmark = [pytest.mark.needs_postgres, pytest.mark.slow]

THIS = "tests/integration/test_docs_blocks_run.py"
_FENCE = re.compile(r"^( *)<!-- docs-test: run: (\S+)[^\n]*-->\n *```(sh|python)\n(.*?)^ *```", re.M | re.S)
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def run_blocks(doc: str) -> list[tuple[str, str]]:
    """(language, code) of each block of `doc` whose marker names this test, in order."""
    found = []
    for m in _FENCE.finditer((ROOT / doc).read_text()):
        if m.group(2) == THIS:
            found.append((m.group(3), re.sub(rf"^{m.group(1)}", "", m.group(4), flags=re.M)))
    return found


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    keys: dict[str, str] = field(default_factory=dict)

    def put_in(self, code: str) -> str:
        for host in ("http://127.0.0.1:8000", "http://coordinator:8000"):
            code = code.replace(host, self.url)
        for redis_url in ("redis://127.0.0.1:6379/0", "redis://redis:6379/0"):
            code = code.replace(redis_url, REDIS_URL)
        code = code.replace('"GROUP-KEY"', repr(self.keys.get("group", "")))
        code = code.replace('"STREAM-KEY"', repr(self.keys.get("stream", "")))
        return code.replace("rsc_AbCdEfGh", self.keys.get("stream", "")[:12])

    def block_env(self) -> dict[str, str]:
        return {**self.env, "GROUP_KEY": self.keys.get("group", ""), "STREAM_KEY": self.keys.get("stream", ""),
                "RSC_API_KEY": self.keys.get("group", ""),
                "PATH": f"{Path(sys.executable).parent}:{self.env.get('PATH', '')}"}

    def sh(self, code: str) -> str:
        """Run a shell block in bash as printed; its `manage.py` commands are forked from the
        test zygote (tests/spawn.shell_prelude), not new interpreters (decision 0019)."""
        env = self.block_env()
        prelude, needs = spawn.shell_prelude(env)
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", prelude + self.put_in(code)], cwd=ROOT,
                              env={**env, **needs}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout

    def create(self) -> str:
        """README's first "Using it" block: stream orders, group billing and three keys."""
        out = self.sh(run_blocks("README.md")[0][1])
        keys = re.findall(r"^(rsc_\S{20,})$", out, flags=re.M)
        assert len(keys) == 3, out
        self.keys = {"group": keys[0], "stream": keys[1], "admin": keys[2]}
        return out

    def members(self) -> list[dict]:
        r = plain_http.get(f"{self.url}/api/v1/groups/billing", headers={"Authorization": f"Bearer {self.keys['group']}"},
                      timeout=5)
        return r.json().get("members", []) if r.status_code == 200 else []

    def consume_until_joined(self, code: str, until: Callable[[str], bool] | None = None,
                             ) -> subprocess.CompletedProcess[str]:
        """Run a Python block that consumes until stopped: SIGTERM once its member joined (and
        `until` holds for what it printed so far)."""
        # O_APPEND: the child writes at the end whatever offset the parent's reads left.
        with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "stdout", "a+") as out_file:
            proc = spawn.Popen([sys.executable, "-c", self.put_in(code)], cwd=ROOT, env=self.block_env(),
                                    stdout=out_file, stderr=subprocess.PIPE, text=True)

            def printed() -> str:
                out_file.seek(0)
                return out_file.read()

            try:
                deadline = time.monotonic() + 60
                while (not self.members() or (until is not None and not until(printed()))) \
                        and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)  # poll interval of a deadline loop
                joined = bool(self.members())
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=60)
                out = printed()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
        assert joined, f"the block's member never joined\n{code}\n{err}"
        assert proc.returncode == 0, f"{code}\n--- stderr\n{err}"
        assert "Traceback" not in err, err
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with fresh_install(tmp_path, "rsc_docs") as install:
        yield from _stack(install)


def _stack(install: FreshInstall) -> Iterator[Stack]:
    env, url = install.env, install.url
    web = None
    try:
        done = spawn.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        web = spawn.Popen([sys.executable, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py",
                                "coordinator_project.wsgi"], cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        up = False
        while not up and time.monotonic() < deadline:
            assert web.poll() is None, web.stderr.read() if web.stderr else ""
            try:
                up = plain_http.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.1)  # poll interval of a deadline loop
        assert up, "gunicorn never answered /healthz"
        yield Stack(url, env)
    finally:
        if web is not None:
            os.killpg(web.pid, signal.SIGTERM)
            try:
                web.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(web.pid, signal.SIGKILL)
                web.wait(5)


def test_i24_7_readme_blocks_run_as_printed(stack: Stack):
    blocks = run_blocks("README.md")
    assert [lang for lang, _ in blocks] == ["sh", "sh", "python"]
    stack.create()
    # A member for fence_member to fence (the block's m-7f3a).
    r = plain_http.post(f"{stack.url}/api/v1/groups/billing/heartbeat", json={"memberId": "m-7f3a", "memberEpoch": 0},
                   headers={"Authorization": f"Bearer {stack.keys['group']}"}, timeout=10)
    assert r.status_code == 200, r.text
    out = stack.sh(blocks[1][1])
    assert '"memberId": "m-7f3a"' in out  # list_members --json
    assert "rsc_" in out.splitlines()[0] or "PREFIX" in out.splitlines()[0]  # list_api_keys' header or a row
    assert "billing" in out
    # The Python member, on a group made anew by the first block (the second deleted it).
    stack.create()
    stack.consume_until_joined(blocks[2][1])
    assert stack.members() == []  # it left the group when stopped


def test_i24_7_dataplane_install_block_runs_in_a_fresh_virtualenv(tmp_path: Path):
    """`pip install ./dataplane` and the wheel, from the repository root, into a virtualenv
    that has nothing else: the console script and the package work from another directory."""
    code = next(code for _lang, code in run_blocks("dataplane/README.md") if code.startswith("pip install"))
    venv = tmp_path / "venv"
    # A venv with pip and nothing else, as `python -m venv` makes, by uv (the dev requirements')
    # from its cache with the pip make install pinned: ensurepip cost ~5 CPU-s, this ~0.3.
    uv = str(Path(sys.executable).with_name("uv"))
    pip = next(line.strip() for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
               if line.startswith("pip=="))
    mirror = {f"UV_{k[4:]}": os.environ[k] for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL") if k in os.environ}
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), pip],
                   env={**os.environ, **mirror}, check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    wheels = tmp_path / "wheels"
    code = code.replace("/tmp/wheels", str(wheels))  # noqa: S108 - the doc's path, replaced by the test's
    done = subprocess.run(["bash", "-e", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert list(wheels.glob("rsc_dataplane-*.whl")), list(wheels.iterdir())
    from dataplane import __version__

    version = subprocess.run([str(venv / "bin" / "rsc-dataplane"), "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"rsc-dataplane {__version__}", version
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", "import dataplane; print(dataplane.__file__)"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert str(venv) in imported.stdout, imported  # the installed copy, not the checkout


def eval_list(line: str) -> list[str]:
    return ast.literal_eval(line.split(" ", 1)[1])


def test_i24_7_dataplane_readme_blocks_run_as_printed(stack: Stack):
    blocks = [b for b in run_blocks("dataplane/README.md") if not b[1].startswith("pip install")]
    assert [lang for lang, _ in blocks] == ["python", "sh", "python", "python"]
    stack.create()
    # Consumer until SIGTERM, then the Producer sends three messages.
    stack.consume_until_joined(blocks[0][1])
    out = stack.sh(blocks[1][1])  # route, produce (argument and stdin), dlq list
    assert '"redisKey"' in out
    assert out.count('"sent"') == 1 or '"shard"' in out
    python = spawn.run([sys.executable, "-c", stack.put_in(blocks[2][1])], cwd=ROOT, env=stack.block_env(),
                            capture_output=True, text=True, timeout=120)
    assert python.returncode == 0, python.stderr
    assert "Traceback" not in python.stderr
    # Rebalance listeners: every shard announced to on_assigned once the member joined (it is
    # alone), then handed back through on_revoked at shutdown, nothing lost.
    listeners = stack.consume_until_joined(blocks[3][1], until=lambda out: "assigned" in out)
    lines = listeners.stdout.splitlines()
    assigned = sorted(s for line in lines if line.startswith("assigned") for s in eval_list(line))
    revoked = sorted(s for line in lines if line.startswith("revoked") for s in eval_list(line))
    assert len(assigned) == 8, listeners.stdout
    assert revoked == assigned, listeners.stdout
    assert not any(line.startswith("lost") for line in lines), listeners.stdout


def test_i24_7_security_and_operating_blocks_run_as_printed(stack: Stack):
    security = run_blocks("docs/SECURITY.md")
    operating = run_blocks("docs/OPERATING.md")
    assert [lang for lang, _ in security] == ["sh"]
    assert [lang for lang, _ in operating] == ["sh"]
    stack.create()
    out = stack.sh(security[0][1])  # keys: create, list, rotate and revoke the producer key
    assert out.count("shown once") >= 2
    out = stack.sh(operating[0][1])  # housekeeping: list, ensure consumer groups, delete
    assert '"orders"' in out
    done = spawn.run([sys.executable, "manage.py", "list_streams"], cwd=ROOT, env=stack.env,
                          capture_output=True, text=True, timeout=120)
    assert "orders" not in done.stdout  # delete_stream removed it


def test_i24_7_resharding_celery_block_runs_the_sweeps(tmp_path: Path) -> None:
    """RESHARDING's one command for the periodic part (a worker with beat inside) runs the
    sweeps on a fresh installation, and stops on SIGTERM."""
    blocks = run_blocks("docs/RESHARDING.md")
    assert [lang for lang, _ in blocks] == ["sh"]
    with fresh_install(tmp_path, "rsc_docs", "SWEEP_INTERVAL_SECONDS=1") as install:
        done = spawn.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=install.env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        log = tmp_path / "celery.log"
        with log.open("w") as out:
            celery = subprocess.Popen(["bash", "-c", blocks[0][1]], cwd=ROOT, env=install.env, start_new_session=True,
                                      stdout=out, stderr=subprocess.STDOUT)
        try:
            def swept() -> bool:
                assert celery.poll() is None, log.read_text()
                row = install.sql("SELECT count(*) FROM groups_sweeprun WHERE last_finished_at IS NOT NULL")
                return bool(row and row[0] >= 2)  # liveness and resharding

            assert poll(swept, 90, interval=0.2), log.read_text()
        finally:
            # SIGTERM to the worker's main process (bash execs the block's one command), as a
            # supervisor stops it: it finishes its tasks and stops its pool. A SIGTERM to the
            # whole group also kills the pool's children mid-task, and the main process logs
            # WorkerLostError tracebacks (seen once in CI: a sweep was running).
            celery.send_signal(signal.SIGTERM)
            try:
                celery.wait(30)
            except subprocess.TimeoutExpired:
                celery.kill()
                celery.wait(5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(celery.pid, signal.SIGKILL)  # anything the block left behind
        assert "Traceback" not in log.read_text(), log.read_text()
