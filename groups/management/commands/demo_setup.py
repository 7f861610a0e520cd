"""Set up the demo for `make run`: a stream, a group, fresh keys and an admin login.

Idempotent: an existing stream or group is reused; keys are new on every run (only their
hashes are stored) and the previous run's demo keys are revoked, so runs do not pile up keys.
The admin password is RSC_ADMIN_PASSWORD when set (make run keeps it in its env file, so it
stays the same from run to run), else a new one. The demo's names (demo-orders, demo-billing) differ from the README's
first example, so following the README beside a running demo collides with nothing.
Prints them as one JSON object (scripts/run.py reads it). With --prepare it migrates and collects
the static files first.
"""
from __future__ import annotations

import json
import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError, CommandParser
from django.db.models import Q

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.models import ApiKey, Group, Stream
from groups.namespace import claim_prefix, default_key_prefix
from groups.services import create_api_key, create_group, create_stream, key_is_active, revoke_api_key

DEMO_KEY_NAMES = ("demo member", "demo producer")


class Command(OperatorCommand):
    help = "Create the demo stream/group/keys and an admin user; print them as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stream", default="demo-orders")
        parser.add_argument("--group", default="demo-billing")
        parser.add_argument("--shards", type=int, default=4)
        parser.add_argument("--prepare", action="store_true",
                            help="first migrate and collect the static files, in this process (make run:"
                                 " one start of Django instead of three)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["prepare"]:
            call_command("migrate", interactive=False, verbosity=0)
            call_command("collectstatic", interactive=False, verbosity=0)
        stream, group = opts["stream"], opts["group"]
        try:
            existing = Stream.objects.filter(name=stream).first()
            if existing is None:
                create_stream(stream, opts["shards"])
            else:  # a stream of an older run: its prefix must still be this installation's
                claim_prefix(existing.key_prefix)
            if not Group.objects.filter(name=group).exists():
                create_group(group, stream, heartbeat_interval_ms=1000, session_timeout_ms=10_000,
                             rebalance_timeout_ms=30_000)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        username = os.environ.get("RSC_ADMIN_USER", "admin")
        password = os.environ.get("RSC_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None:
            user = user_model.objects.create_superuser(username, "", password)
        else:
            user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
        previous = ApiKey.objects.filter(Q(group__name=group) | Q(stream__name=stream),
                                         name__in=DEMO_KEY_NAMES, revoked_at__isnull=True)
        for old in previous:
            if key_is_active(old):
                revoke_api_key(old, actor="demo_setup")
        version = Stream.objects.get(name=stream).versions.order_by("-version").first()
        values = {
            "shards": version.shard_count if version is not None else opts["shards"],
            "streamState": Stream.objects.get(name=stream).state,
            "stream": stream,
            "group": group,
            "groupKey": create_api_key(group=group, name="demo member"),
            "streamKey": create_api_key(stream=stream, name="demo producer"),
            "adminUser": username,
            "adminPassword": password,
            "namespace": default_key_prefix(),
        }
        self.stdout.write(json.dumps(values))
