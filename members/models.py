"""Members of a group, live ones and the tombstones that tell a stale process why (R8, L1)."""
from __future__ import annotations

from django.db import models

from coordination.model import MemberStatus


class Member(models.Model):
    group = models.ForeignKey("groups.Group", on_delete=models.CASCADE, related_name="members")
    member_id = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=[(s.value, s.value) for s in MemberStatus], db_index=True
    )
    member_epoch = models.IntegerField(default=0, editable=False)
    previous_member_epoch = models.IntegerField(default=0, editable=False)
    client_id = models.CharField(max_length=200, blank=True)
    rebalance_timeout_ms = models.PositiveIntegerField(default=60_000)
    joined_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True, editable=False)
    revocation_deadline = models.DateTimeField(null=True, blank=True, editable=False)
    last_reported_owned = models.JSONField(default=list, blank=True, editable=False)
    fenced_reason = models.CharField(max_length=500, blank=True)
    fenced_by = models.CharField(max_length=150, blank=True)
    # The group's state_version of the last locked write of this row (snapshot deltas).
    state_version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "member_id"], name="uniq_group_member"),
        ]
        indexes = [models.Index(fields=["group", "state_version"], name="member_group_version")]
        permissions = [("fence_member", "Can fence or remove members")]

    def __str__(self) -> str:
        return self.member_id
