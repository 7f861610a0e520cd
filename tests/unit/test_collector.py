"""Decision 0027: a web worker's collector runs full passes ten times less often than
CPython's default, so a worker holding a large group snapshot does not stall every request for
a full pass each time a few reads of its members' rows come and go.

Each scenario runs in a process of its own: settle() freezes and re-tunes the collector of the
process that calls it."""
from __future__ import annotations

import json
import sys

from tests import spawn
from tests.integration.conftest import ROOT
from webserver.collector import FULL_PASS_EVERY

# A worker's long-lived state (a snapshot: ~110,000 tracked objects at 10,000 members), then
# reads of 10,000 rows, each kept until the next replaces it (the reads of held reports).
# Prints the full passes the reads caused, and the collector's settings.
SCENARIO = """
import gc, json, sys

class Slot:
    __slots__ = ("shard", "owner")

    def __init__(self, i):
        self.shard, self.owner = f"s{i}", [i]

snapshot = {i: Slot(i) for i in range(100_000)}
if sys.argv[1] == "settled":
    from webserver.collector import settle

    settle()
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2 and full.append(1))
held = None
for _ in range(40):
    held = {f"m{i}": [i, f"r{i}"] for i in range(10_000)}
print(json.dumps({"full": len(full), "threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def run(mode: str) -> dict:
    done = spawn.run([sys.executable, "-c", SCENARIO, mode], cwd=ROOT, capture_output=True, text=True,
                     timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_i26_settled_collector_runs_no_full_pass_while_reads_of_rows_come_and_go_beside_a_snapshot():
    stock, settled = run("stock"), run("settled")
    assert stock["full"] >= 2, stock  # the scenario does cost full passes with CPython's default
    assert settled["full"] == 0, settled
    assert settled["threshold"] == [stock["threshold"][0], stock["threshold"][1], FULL_PASS_EVERY], settled
    assert settled["frozen"] >= 100_000, settled  # the snapshot loaded before settle() is out of every pass
