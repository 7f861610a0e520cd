"""``python -m dataplane``: the CLI (``dataplane.cli``), also installed as ``rsc-dataplane``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
