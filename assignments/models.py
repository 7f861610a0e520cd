"""One row per (group, shard): its target member, current owner and grant epoch.

Owner and revoking live in the same row, and (group, shard) is unique, so the database
itself forbids two members owning or revoking one shard of a group (R9).
"""
from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any, TypeAlias
from uuid import UUID

from django.db import models

# A raw statement's parameter: what the database adapter takes (django-stubs' CursorWrapper).
SQLValue: TypeAlias = (
    bool | int | float | Decimal | str | bytes | date | UUID | tuple[Any, ...] | list[Any] | None
)


def concrete_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """`model`'s field `name`, one with a column (for raw SQL)."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field):  # a reverse relation or a generic key: no column
        raise TypeError(f"{model.__name__}.{name} has no column")
    return field


def db_column(model: type[models.Model], name: str) -> str:
    """The database column of `model`'s field `name`."""
    return concrete_field(model, name).column


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
