"""ShardAssignment rows, read-only: the core writes them (through assignments.writer.save_state)."""
from __future__ import annotations

from django.contrib import admin

from assignments.models import ShardAssignment
from groups.admin_base import ReadOnlyAdmin


@admin.register(ShardAssignment)
class ShardAssignmentAdmin(ReadOnlyAdmin):
    list_display = ("group", "shard", "version_state", "target", "owner", "revoking_flag", "grant_epoch", "drained_at")
    list_filter = ("group", "revoking", "shard__version__state")
    search_fields = ("shard__shard_id", "owner__member_id", "target__member_id", "group__name")
    list_select_related = ("group", "shard__version", "target", "owner")
    ordering = ("group__name", "shard__version__version", "shard__index")
    fields = ("group", "shard", "version_state", "target", "owner", "revoking", "grant_epoch", "drained_at")
    readonly_fields = fields

    @admin.display(description="revoking", ordering="revoking")
    def revoking_flag(self, obj: ShardAssignment) -> str:
        # Not revoking is the normal case, not an error: no red cross for it.
        return "revoking" if obj.revoking else "—"

    @admin.display(description="version", ordering="shard__version__version")
    def version_state(self, obj: ShardAssignment) -> str:
        v = obj.shard.version
        return f"v{v.version} {v.state}"
