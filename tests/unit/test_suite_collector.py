"""Decision 0019, sixth round: a test process runs with what it imported at collection frozen,
so the collector's passes do not walk pytest, Django, hypothesis and every test module again
and again (they were a tenth of an xdist worker's CPU)."""
from __future__ import annotations

import gc


def test_the_test_process_runs_with_its_collected_modules_frozen_and_rare_full_passes():
    assert gc.isenabled()
    assert gc.get_freeze_count() > 50_000  # ~200,000 in a whole-suite collection
    assert gc.get_threshold() == (10_000, 10, 100)
