"""Reference endpoints measured beside the real heartbeat (never routed in production).

- CeilingView: DRF parses the body and answers; no database (the ceiling for a DRF view).
- NaiveHeartbeatView: the naive design — lock the group row, read the member, stamp
  last-seen, commit — via the ORM, so every heartbeat of a group queues on one lock.
- CollectorView: the answering worker's collector settings (decision 0027), for the bench's
  record and the test that the shipped config applies them.
"""
from __future__ import annotations

import gc
import os

from django.db import transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from groups.models import Group
from members.models import Member


def _answer(data: dict) -> dict:
    return {
        "errorCode": "NONE", "errorMessage": None, "status": "OK",
        "memberId": data.get("memberId"), "memberEpoch": data.get("memberEpoch"),
        "assignmentEpoch": data.get("memberEpoch"), "heartbeatIntervalMs": 3000,
        "assignment": {"assignedShards": data.get("ownedShards") or [], "pendingShards": [],
                       "revokingShards": []},
        "metadata": {"metadataEpoch": data.get("metadataEpoch")},
    }


class CeilingView(APIView):
    authentication_classes: list = []

    def post(self, request: Request) -> Response:
        return Response(_answer(request.data))


class CollectorView(APIView):
    authentication_classes: list = []

    def get(self, request: Request) -> Response:
        return Response({"pid": os.getpid(), "threshold": list(gc.get_threshold()),
                         "frozen": gc.get_freeze_count()})


class NaiveHeartbeatView(APIView):
    authentication_classes: list = []

    def post(self, request: Request) -> Response:
        data = request.data
        with transaction.atomic():
            group = Group.objects.select_for_update().get(name="bench")
            member = Member.objects.get(group=group, member_id=data["memberId"])
            member.last_heartbeat_at = timezone.now()
            member.save(update_fields=["last_heartbeat_at"])
        return Response(_answer(data))
