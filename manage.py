#!/usr/bin/env python
"""Django's command-line utility, with an operator's mistakes as one line (coordinator_project.preflight)."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
    from coordinator_project.preflight import run_management

    sys.exit(run_management(sys.argv))


if __name__ == "__main__":
    main()
