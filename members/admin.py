"""Members admin: liveness at a glance, and the operator's fence / remove (R8).

The actions call members.services.fence_member / remove_member one member at a time (each
under its group's row lock, through the core), never a bulk update, and need the
"members.fence_member" permission. Member rows are otherwise read-only here.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from assignments.selectors import held_shards
from coordination.liveness import Liveness, liveness
from coordination.model import LIVE_STATUSES, MemberStatus
from groups.admin_base import ReadOnlyAdmin, actor_of, when_column
from groups.errors import ServiceError
from members import selectors, services
from members.models import Member

_LIVE = [s.value for s in LIVE_STATUSES]
FENCE_PERMISSION = "members.fence_member"


class LivenessFilter(admin.SimpleListFilter):
    """alive / late / expired, per group's settings: coordination.liveness's cutoffs in SQL."""

    title = "heartbeat"
    parameter_name = "liveness"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v.value, v.value) for v in (Liveness.ALIVE, Liveness.LATE, Liveness.EXPIRED)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Member]) -> QuerySet[Member]:
        value = self.value()
        if value not in {v.value for v in Liveness}:
            return queryset
        return selectors.filter_by_liveness(queryset, Liveness(value), timezone.now())


@admin.register(Member)
class MemberAdmin(ReadOnlyAdmin):
    list_display = (
        "member_id", "group", "status", "member_epoch", "heartbeat", "shards", "fencing", "client_id",
        "instance_id", "library_version",
    )
    list_filter = ("group", "status", LivenessFilter)
    search_fields = ("member_id", "client_id", "instance_id", "library_version")
    list_select_related = ("group",)
    ordering = ("group__name", "member_id")
    actions = ["fence_members", "remove_members"]
    fields = (
        "group", "member_id", "client_id", "instance_id", "library_version", "status", "member_epoch", "previous_member_epoch", "heartbeat",
        "joined", "last_heartbeat", "revocation_deadline", "rebalance_timeout_ms",
        "last_reported_owned", "held_shards", "fenced_by", "fenced_reason",
    )
    readonly_fields = fields
    joined = when_column("joined_at", "joined")
    last_heartbeat = when_column("last_heartbeat_at", "last heartbeat")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Member]:
        return selectors.with_shard_counts(super().get_queryset(request))

    @admin.display(description="since last heartbeat")
    def heartbeat(self, obj: Member) -> str:
        if obj.status not in _LIVE:
            return "—"
        g = obj.group
        if obj.status == MemberStatus.TEMPORARILY_LEFT and obj.last_heartbeat_at is not None:  # §9 L1s
            left = g.session_timeout_ms / 1000 - (timezone.now() - obj.last_heartbeat_at).total_seconds()
            return f"temporarily left (expires in {max(0, round(left))} s)"
        seconds, alive = liveness(obj.last_heartbeat_at, timezone.now(), g.heartbeat_interval_ms, g.session_timeout_ms)
        if seconds is None:
            return "never"
        return format_html('<span class="rsc-{}">{} s · {}</span>', alive.value, f"{seconds:.1f}", alive.value)

    @admin.display(description="shards (revoking)", ordering="held")
    def shards(self, obj: Member) -> str:
        held = getattr(obj, "held", 0)
        revoking = getattr(obj, "revoking", 0)
        return f"{held} ({revoking})" if revoking else str(held)

    @admin.display(description="fencing")
    def fencing(self, obj: Member) -> str:
        if obj.status in _LIVE:
            return "live"
        who = f" by {obj.fenced_by}" if obj.fenced_by else ""
        why = f": {obj.fenced_reason}" if obj.fenced_reason else ""
        return f"{obj.status.lower()}{who}{why}"

    @admin.display(description="held shards (grant epoch)")
    def held_shards(self, obj: Member) -> str:
        rows = held_shards(obj.pk)
        parts = [f"{a.shard.shard_id}@{a.grant_epoch}{' revoking' if a.revoking else ''}" for a in rows]
        return ", ".join(parts) or "—"

    # --- actions ---------------------------------------------------------------------------------
    def has_fence_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(FENCE_PERMISSION)

    @admin.action(description="Fence selected members (FENCED_MEMBER_EPOCH on their next heartbeat)",
                  permissions=["fence"])
    def fence_members(self, request: HttpRequest, queryset: QuerySet[Member]) -> HttpResponse | None:
        return self._operator_action(request, queryset, "fence", "fenced", services.fence_member)

    @admin.action(description="Remove selected members (UNKNOWN_MEMBER_ID on their next heartbeat)",
                  permissions=["fence"])
    def remove_members(self, request: HttpRequest, queryset: QuerySet[Member]) -> HttpResponse | None:
        return self._operator_action(request, queryset, "remove", "removed", services.remove_member)

    def _operator_action(
        self,
        request: HttpRequest,
        queryset: QuerySet[Member],
        verb: str,
        done_word: str,
        service: Callable[..., None],
    ) -> HttpResponse | None:
        # Checked here too: the action list hides it, but a crafted POST must not get through.
        if not self.has_fence_permission(request):
            raise PermissionDenied
        members = list(queryset.select_related("group").order_by("group__name", "member_id"))
        if request.POST.get("post") != "yes":
            return TemplateResponse(request, "admin/members/member/confirm_action.html", {
                **self.admin_site.each_context(request),
                "title": f"{verb.capitalize()} {len(members)} member{'s' if len(members) != 1 else ''}?",
                "opts": self.model._meta,
                "verb": verb,
                "action": f"{verb}_members",
                "members": members,
                "live": set(_LIVE),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            })
        reason = request.POST.get("reason", "").strip()[:400]
        actor = actor_of(request)
        done: list[str] = []
        skipped: list[str] = []
        for m in members:
            try:
                service(m.group.name, m.member_id, reason=reason, actor=actor)
            except ServiceError:
                skipped.append(f"{m.group.name}/{m.member_id}")  # not live any more: nothing to do
            else:
                done.append(f"{m.group.name}/{m.member_id}")
        if done:
            self.message_user(
                request, f"{done_word.capitalize()} {len(done)} member{'s' if len(done) != 1 else ''}: "
                f"{_names(done)}.", messages.SUCCESS,
            )
        if skipped:
            self.message_user(
                request, f"Skipped {len(skipped)} not live: {_names(skipped)}.", messages.WARNING,
            )
        return None


def _names(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
