"""Issue 23.9: the coordinator's manage.py commands skip Django's system checks (0.4 of a
0.9 CPU-s `list_streams` here: the URLconf, admin and API schema imported for nothing), and
every new command does too, by its base class."""
from __future__ import annotations

from django.core.management import get_commands, load_command_class

from coordinator_project.commands import OperatorCommand

OURS = ("groups", "members", "assignments", "coordinator_project")


def test_i23_9_every_coordinator_command_is_an_operator_command_without_system_checks():
    ours = {name: app for name, app in get_commands().items() if app in OURS}
    assert len(ours) >= 25, ours  # the operator's commands were found
    for name, app in sorted(ours.items()):
        command = load_command_class(app, name)
        assert isinstance(command, OperatorCommand), f"manage.py {name} ({app}) is not an OperatorCommand"
        assert command.requires_system_checks == [], name

