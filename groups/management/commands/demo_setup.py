"""Set up the demo for `make run`: a stream, a group, fresh keys and an admin login.

Idempotent: an existing stream or group is reused; keys are new on every run (only their
hashes are stored). Prints shell assignments for scripts/run.sh to source.
"""
from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from groups.models import Group, Stream
from groups.services import create_api_key, create_group, create_stream


class Command(BaseCommand):
    help = "Create the demo stream/group/keys and an admin user; print them as shell variables."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stream", default="orders")
        parser.add_argument("--group", default="billing")
        parser.add_argument("--shards", type=int, default=4)

    def handle(self, *args: Any, **opts: Any) -> None:
        stream, group = opts["stream"], opts["group"]
        if not Stream.objects.filter(name=stream).exists():
            create_stream(stream, opts["shards"])
        if not Group.objects.filter(name=group).exists():
            create_group(group, stream, heartbeat_interval_ms=1000, session_timeout_ms=10_000,
                         rebalance_timeout_ms=30_000)
        username = os.environ.get("RSC_ADMIN_USER", "admin")
        password = os.environ.get("RSC_ADMIN_PASSWORD") or secrets.token_urlsafe(9)
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None:
            user = user_model.objects.create_superuser(username, "", password)
        else:
            user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
        values = {
            "DEMO_STREAM": stream,
            "DEMO_GROUP": group,
            "DEMO_GROUP_KEY": create_api_key(group=group, name="demo member"),
            "DEMO_STREAM_KEY": create_api_key(stream=stream, name="demo producer"),
            "DEMO_ADMIN_USER": username,
            "DEMO_ADMIN_PASSWORD": password,
        }
        for name, value in values.items():
            self.stdout.write(f"{name}={value}")
