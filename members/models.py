"""Members of a group, live ones and the tombstones that tell a stale process why (R8, L1)."""
from __future__ import annotations

from django.db import models

from coordination.model import LIVE_STATUSES, MemberStatus


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
    # §9 static membership. Tombstones keep it (the admin shows whose place they held).
    instance_id = models.CharField(max_length=64, null=True, blank=True, editable=False)
    # Issue 25.7: the member's client library and version ("rsc-dataplane/0.2.0": the first
    # product of its User-Agent), recorded at each join.
    library_version = models.CharField(max_length=64, blank=True, default="", editable=False)
    # The group's state_version of the last locked write of this row (snapshot deltas).
    state_version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "member_id"], name="uniq_group_member"),
            # §9: a group holds at most one member per instanceId.
            models.UniqueConstraint(
                fields=["group", "instance_id"],
                condition=models.Q(instance_id__isnull=False)
                & models.Q(status__in=sorted(s.value for s in LIVE_STATUSES)),
                name="uniq_group_live_instance",
            ),
        ]
        indexes = [models.Index(fields=["group", "state_version"], name="member_group_version")]
        permissions = [("fence_member", "Can fence or remove members")]

    def __str__(self) -> str:
        return self.member_id


class IntakeBeacon(models.Model):
    """The web tier's "accepting heartbeats" stamp (L1/L2 count only silence it could hear).

    One row per intake (today only "heartbeat"): every web worker stamps `beat_at` about once
    a second; a stamp after a gap longer than INTAKE_MAX_GAP_SECONDS moves `up_since` to
    that stamp (see members.intake).
    """

    name = models.CharField(max_length=32, unique=True)
    beat_at = models.DateTimeField()
    up_since = models.DateTimeField()
    node = models.CharField(max_length=200, blank=True, help_text="Last writer, host:pid.")

    def __str__(self) -> str:
        return f"{self.name} up since {self.up_since:%Y-%m-%d %H:%M:%S}"
