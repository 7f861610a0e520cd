"""Issue 24.7: dataplane/README's CLI synopsis names every flag of each `rsc-dataplane` command
(it lacked --instance-id, --api-key-file and --max-concurrency once); a flag added without it
fails here. Read from the parser itself, per command."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from dataplane.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def synopsis_by_command() -> dict[str, str]:
    readme = (ROOT / "dataplane" / "README.md").read_text()
    block = re.search(r"^## CLI\n.*?```sh\n(.*?)```", readme, flags=re.S | re.M)
    assert block is not None
    text = block.group(1).replace("\\\n", " ")  # continuation lines join their command
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"rsc-dataplane (\w+)", line)
        if m:
            found[m.group(1)] = found.get(m.group(1), "") + " " + line.split("#", 1)[0]
    return found


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every option of a command, its subcommands' too (dlq list|replay|purge share one line)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _flags(sub)
        elif action.option_strings and "--help" not in action.option_strings:
            found.append(action)
    return found


def test_i24_7_the_cli_synopsis_names_every_flag_of_every_command():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    synopsis = synopsis_by_command()
    missing = []
    for name, parser in sub.choices.items():
        line = synopsis.get(name)
        if line is None:
            missing.append(f"{name}: no synopsis line")
            continue
        for action in _flags(parser):
            if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", line) for o in action.option_strings):
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert not missing, f"dataplane/README.md's CLI synopsis lacks: {missing}"
