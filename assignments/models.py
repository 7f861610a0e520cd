"""One row per (group, shard): its target member, current owner and grant epoch.

Owner and revoking live in the same row, and (group, shard) is unique, so the database
itself forbids two members owning or revoking one shard of a group (R9).
"""
from __future__ import annotations

from django.db import models


class ShardAssignment(models.Model):
    group = models.ForeignKey("groups.Group", on_delete=models.CASCADE, related_name="shard_assignments")
    shard = models.ForeignKey("groups.Shard", on_delete=models.CASCADE, related_name="assignments")
    target = models.ForeignKey(
        "members.Member", null=True, blank=True, on_delete=models.PROTECT, related_name="target_shards"
    )
    owner = models.ForeignKey(
        "members.Member", null=True, blank=True, on_delete=models.PROTECT, related_name="owned_shards"
    )
    revoking = models.BooleanField(default=False)
    grant_epoch = models.PositiveIntegerField(default=0, editable=False)
    drained_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The group's state_version of the last locked write of this row (snapshot deltas).
    state_version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        indexes = [models.Index(fields=["group", "state_version"], name="slot_group_version")]
        constraints = [
            models.UniqueConstraint(fields=["group", "shard"], name="r9_one_owner_per_shard"),
            models.CheckConstraint(
                condition=models.Q(revoking=False) | models.Q(owner__isnull=False),
                name="revoking_needs_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.group_id}/{self.shard_id}"
