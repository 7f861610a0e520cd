"""Issue 23.1: one owner for per-process state (coordinator_project.process_state.PROCESS).

Every cache, memo, queue, gate and buffer a coordinator process keeps is owned by PROCESS with
a one-line contract (key, bound, invalidation, why it is correct with N hosts); reset()
empties them (tests, a database rewind) and no module keeps one of its own on the side.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from coordinator_project.process_state import DOC_PARTS, PROCESS, Owned

ROOT = Path(__file__).resolve().parents[2]
APPS = ("assignments", "groups", "members", "coordinator_project")
# Modules whose state PROCESS owns: imported so that each has handed its state over.
OWNERS = (
    "assignments.rows", "assignments.snapshot_cache", "assignments.gates", "assignments.fastpath", "assignments.services", "groups.services",
    "groups.metadata", "groups.ratelimit", "groups.shardstats", "groups.namespace",
    "groups.resharding", "groups.api_errors", "coordinator_project.metrics",
    "coordinator_project.views",
)
_EMPTY_CONTAINERS = {"dict", "set", "list", "OrderedDict", "deque", "defaultdict", "NamedLocks",
                     "TokenBuckets", "LogThrottle", "WeakValueDictionary", "WeakKeyDictionary"}
_CACHE_DECORATORS = {"cache", "lru_cache"}


@pytest.fixture(scope="module")
def owned() -> dict[str, Owned]:
    for name in OWNERS:
        importlib.import_module(name)
    return PROCESS.owned()


def test_i23_1_every_owned_cache_states_key_bound_invalidation_and_why_n_hosts(owned: dict[str, Owned]):
    assert len(owned) >= 20
    undocumented = {name: [p for p in DOC_PARTS if p not in entry.doc] for name, entry in owned.items()}
    assert {name: parts for name, parts in undocumented.items() if parts} == {}


def test_i23_1_the_core_s_memos_are_owned_too(owned: dict[str, Owned]):
    from coordination import assignor

    things = [entry.thing for entry in owned.values()]
    assert any(t is assignor._order_cache for t in things)
    assert any(t is assignor._rank_cache for t in things)


def _decorator_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _loose_state(path: Path, root: Path = ROOT) -> list[str]:
    """Module-level containers and memoized functions not handed to PROCESS.own()."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owned_names = {
        arg.id for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _decorator_name(node) == "own"
        for arg in node.args if isinstance(arg, ast.Name)
    }
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Dict, ast.Set, ast.List, ast.Call)):
            value = node.value
            empty = (isinstance(value, (ast.Dict, ast.List)) and not (getattr(value, "keys", None) or getattr(value, "elts", None)))
            made = isinstance(value, ast.Call) and _decorator_name(value) in _EMPTY_CONTAINERS
            if empty or made:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
        elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              and any(_decorator_name(d) in _CACHE_DECORATORS for d in node.decorator_list)
              and node.name not in owned_names):
            found.append(f"{path.relative_to(root)}:{node.lineno} ({node.name})")
    return found


def test_i23_1_no_module_keeps_per_process_state_of_its_own():
    loose = [
        where for app in APPS for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts and path.name not in {"settings.py", "test_settings.py"}
        for where in _loose_state(path)
    ]
    assert loose == [], "hand these to coordinator_project.process_state.PROCESS.own():\n" + "\n".join(loose)


def test_i23_1_the_check_catches_loose_state(tmp_path: Path):
    source = (
        "import functools\nfrom collections import OrderedDict\n"
        "_seen: dict[str, int] = {}\n_order = OrderedDict()\n_owned = PROCESS.own('x', {}, 'doc')\n"
        "@functools.cache\ndef _client(url): ...\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert _loose_state(path, tmp_path) == ["mod.py:3", "mod.py:4", "mod.py:7 (_client)"]


def test_i23_1_reset_empties_every_cache(owned: dict[str, Owned]):
    from assignments import snapshot_cache
    from groups import metadata, services

    filled = []
    for name, entry in owned.items():
        thing = entry.thing
        default_reset = entry.reset in (getattr(thing, "reset", None), getattr(thing, "clear", None))
        if isinstance(thing, dict) and default_reset:
            thing[("test", name)] = object()
            filled.append(thing)
    snapshot_cache._snapshots[-1] = object()  # type: ignore[assignment]
    assert metadata._cache
    assert services._key_cache
    assert filled
    PROCESS.reset()
    assert not snapshot_cache._snapshots
    assert [t for t in filled if t] == []


def test_i23_3_a_new_installation_generation_drops_everything_without_flushing():
    from coordinator_project.process_state import ProcessCache, ProcessState

    state = ProcessState()
    cache: ProcessCache[str, int] = state.own("c", ProcessCache(), "key: k; bound: 1; invalidated: x; N hosts: y")
    flushed: list[str] = []
    pending = state.own("p", ["stamp"], "key: k; bound: 1; invalidated: x; N hosts: y",
                        reset=lambda: flushed.append("flushed"), rewind=lambda: pending.clear())
    state.observe_generation(1)  # the first read: nothing to drop
    cache["a"] = 1
    state.observe_generation(1)
    assert cache == {"a": 1}
    assert state.rewinds == 0
    state.observe_generation(2)  # raise_epochs_after_restore ran
    assert cache == {}
    assert pending == []
    assert flushed == []  # stamps of the abandoned history are dropped, never written
    assert state.rewinds == 1
    assert state.generation == 2


@pytest.fixture
def unstarted():
    """Leaves PROCESS as a process that was never started as a worker."""
    yield
    PROCESS.cooperative, PROCESS.started_pid = False, None
    PROCESS._owned.pop("late module", None)
    from assignments import fastpath

    fastpath._GROUP_READS.configure(cooperative=False)


def test_i23_1_a_worker_start_forgets_what_the_process_inherited_and_decides_per_worker(
    owned: dict[str, Owned], unstarted: None
):
    """gunicorn's post_worker_init and Celery's worker_process_init call PROCESS.start: what the
    master (or an import) left in the caches is gone, and the shared group reads coalesce only
    on a cooperative (gevent) worker, as chosen there (issue 23.6: not sniffed per request)."""
    import os

    from assignments import fastpath, snapshot_cache

    snapshot_cache._seats["inherited"] = (1, 1)
    PROCESS.start(cooperative=True)
    assert "inherited" not in snapshot_cache._seats
    assert PROCESS.started_pid == os.getpid()
    assert fastpath._GROUP_READS.cooperative is True
    PROCESS.start(cooperative=False)
    assert fastpath._GROUP_READS.cooperative is False
    chosen = []
    PROCESS.own("late module", {}, "key: k; bound: b; invalidated: i; N hosts: n.",
                start=lambda process: chosen.append(process.cooperative))
    assert chosen == [False]  # imported after the start: decided at once


def test_i23_1_no_owned_entry_has_a_reset_that_does_nothing(owned: dict[str, Owned]):
    """The three entries whose reset was `lambda: None` (shared group reads, key lookups in
    flight, shard figure refreshes) forget what they hold."""
    from assignments import fastpath
    from groups import services, shardstats

    fastpath._GROUP_READS._next["g"] = object()  # type: ignore[assignment]
    services._flights["k"] = object()  # type: ignore[assignment]
    shardstats._refreshing.add(("g", "p", ()))
    PROCESS.reset()
    assert not fastpath._GROUP_READS._next
    assert not services._flights
    assert not shardstats._refreshing
    noop = [name for name, entry in owned.items()
            if getattr(entry.reset, "__code__", None) is not None and entry.reset.__code__.co_code
            == (lambda: None).__code__.co_code and not entry.reset.__code__.co_names]
    assert noop == []
