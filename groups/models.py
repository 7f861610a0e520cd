"""Streams, shard versions, shards, groups, API keys, the event log and sweep bookkeeping."""
from __future__ import annotations

from django.db import models


class StreamState(models.TextChoices):
    STABLE = "STABLE"
    PREPARING = "PREPARING"
    SEALING = "SEALING"
    DRAINING = "DRAINING"


class VersionState(models.TextChoices):
    ACTIVE = "ACTIVE"  # readable; the newest one is the write version
    SEALED = "SEALED"  # seal markers written: draining, no more appends
    RETIRED = "RETIRED"  # every group drained it


class StartPosition(models.TextChoices):
    EARLIEST = "earliest"
    LATEST = "latest"


class Stream(models.Model):
    name = models.CharField(max_length=200, unique=True)
    key_prefix = models.CharField(max_length=64, default="rsc")
    state = models.CharField(max_length=16, choices=StreamState.choices, default=StreamState.STABLE)
    write_version = models.PositiveIntegerField(default=1)
    metadata_epoch = models.PositiveIntegerField(default=1, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ShardVersion(models.Model):
    stream = models.ForeignKey(Stream, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    shard_count = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=VersionState.choices, default=VersionState.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    sealed_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["stream", "version"], name="uniq_stream_version"),
        ]
        ordering = ["stream_id", "version"]

    def __str__(self) -> str:
        return f"{self.stream.name} v{self.version} ({self.shard_count} shards, {self.state})"


class Shard(models.Model):
    version = models.ForeignKey(ShardVersion, on_delete=models.CASCADE, related_name="shards")
    shard_id = models.CharField(max_length=240, unique=True)  # "<stream>:<version>:<index>"
    index = models.PositiveIntegerField()
    # Shard ids of the previous version whose hash ranges overlap this one (§2 routing).
    parents = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["version_id", "index"]

    def __str__(self) -> str:
        return self.shard_id


class Group(models.Model):
    name = models.CharField(max_length=200, unique=True)
    stream = models.ForeignKey(Stream, on_delete=models.PROTECT, related_name="groups")
    # Epochs are fencing tokens: only the protocol core changes them.
    group_epoch = models.PositiveIntegerField(default=1, editable=False)
    assignment_epoch = models.PositiveIntegerField(default=1, editable=False)
    metadata_epoch = models.PositiveIntegerField(default=1, editable=False)
    heartbeat_interval_ms = models.PositiveIntegerField(default=3000)
    session_timeout_ms = models.PositiveIntegerField(default=30_000)
    rebalance_timeout_ms = models.PositiveIntegerField(default=60_000)
    max_members = models.PositiveIntegerField(default=1000)
    start_position = models.CharField(
        max_length=8, choices=StartPosition.choices, default=StartPosition.EARLIEST
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Raised by every locked write of members or slots (assignments.writer.save_state), and
    # stamped on the rows it wrote: a process's cached snapshot of the group is exact while
    # this matches, and catches up by reading only the rows stamped after its own version.
    state_version = models.BigIntegerField(default=0, editable=False)
    # Raised (with state_version) by every delete of the group's member or slot rows
    # (assignments.writer.delete_members): a snapshot catches up by the rows stamped after its
    # version, which cannot show a row that is gone, so a snapshot of an older deletion_epoch
    # is loaded again in full (issue 27.5: a deleted tombstone left live in a snapshot).
    deletion_epoch = models.BigIntegerField(default=0, editable=False)
    # Join batching (coordination.engine.r1b_defer_rebalance): when the target was last
    # recomputed, when a recompute that joins or leaves deferred is due (null: none waits), and
    # when the first change it waits for came.
    rebalanced_at = models.DateTimeField(null=True, blank=True, editable=False)
    rebalance_due_at = models.DateTimeField(null=True, blank=True, editable=False)
    rebalance_deferred_at = models.DateTimeField(null=True, blank=True, editable=False)
    # §11 group pause (coordination.engine.s11_pause): since when (null: not paused), by whom.
    paused_at = models.DateTimeField(null=True, blank=True, editable=False)
    paused_by = models.CharField(max_length=150, blank=True, default="", editable=False)

    class Meta:
        # "Groups" alone reads like django.contrib.auth's groups in the admin.
        verbose_name = "consumer group"

    def __str__(self) -> str:
        return self.name


class KeyRole(models.TextChoices):
    """What a key may do (docs/SECURITY.md)."""

    GROUP = "group"  # heartbeat + describe of its group, routing of the group's stream
    PRODUCE = "produce"  # routing of its stream
    ADMIN = "admin"  # routing + reshard of its stream


class ApiKey(models.Model):
    """A bearer key for one group (role group) or one stream (role produce or admin).

    Only a SHA-256 of the key is stored: keys are 256-bit random, so a slow hash buys nothing.
    A key is valid while not revoked and not past `expires_at` (set by a rotation's grace).
    """

    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, editable=False, db_index=True)  # shown to operators
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    scope = models.CharField(max_length=16, choices=KeyRole.choices, editable=False)
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys")
    stream = models.ForeignKey(Stream, null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Stamped at most once a minute per key (groups.services.resolve_api_key), not per request.
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(group__isnull=False, stream__isnull=True, scope=KeyRole.GROUP)
                           | models.Q(group__isnull=True, stream__isnull=False,
                                      scope__in=[KeyRole.PRODUCE, KeyRole.ADMIN])),
                name="apikey_group_xor_stream_scope",
            ),
        ]
        verbose_name = "API key"

    def __str__(self) -> str:
        scope = f"group {self.group}" if self.group_id else f"stream {self.stream} ({self.scope})"
        return f"{self.prefix}… ({scope})"

    def target(self) -> str:
        """"group G" or "stream S": a key is for one or the other (apikey_group_xor_stream_scope)."""
        if self.group is not None:
            return f"group {self.group.name}"
        return f"stream {self.stream.name}" if self.stream is not None else "nothing"


class Event(models.Model):
    """What happened to a group or stream: joined, left, expired, fenced, rebalanced, reshard steps."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=32, db_index=True)
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    stream = models.ForeignKey(Stream, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    member_id = models.CharField(max_length=64, blank=True, db_index=True)
    group_epoch = models.PositiveIntegerField(null=True, blank=True)
    member_epoch = models.IntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.member_id}".strip()


class SweepRun(models.Model):
    """When each periodic job last ran, so sweep lag is visible (L3)."""

    name = models.CharField(max_length=64, unique=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_result = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.name


class Installation(models.Model):
    """This database's identity: one row (pk 1), made on first use (groups.namespace).

    Its id names this installation's default Redis key prefix and Celery queue, so two
    installations on one Redis never share seal markers, fence tokens or tasks (issue 12).
    """

    installation_id = models.CharField(max_length=32, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Raised by every raise_epochs_after_restore (groups.housekeeping): a restore rewinds the
    # epochs per-process caches are keyed by, and a process that reads a generation other than
    # the one it last saw forgets all it keeps (coordinator_project.process_state, issue 23.3).
    generation = models.BigIntegerField(default=1, editable=False)

    def __str__(self) -> str:
        return self.installation_id
