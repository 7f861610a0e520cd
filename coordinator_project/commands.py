"""The base of the coordinator's own manage.py commands."""
from __future__ import annotations

from django.core.management.base import BaseCommand


class OperatorCommand(BaseCommand):
    """An operator's command (create_group, list_members, sweep, ...). Django runs its system
    checks before every command by default; they import the URLconf, the admin and the API
    schema (about 0.4 of the 0.9 CPU-s `list_streams` took here) and check the project's code
    and settings, not the command's input. `manage.py check --deploy` and `migrate` still run
    them, and coordinator_project.preflight still turns a missing database or setting into one
    line."""

    requires_system_checks: list[str] = []
