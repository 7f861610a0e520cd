"""Admin for streams, groups, the event log and sweep runs (staff only).

Every write goes through a service (create_group, update_group_config, start_reshard), so
the admin applies the same rules as the CLI. Epochs, grant epochs and timestamps are fencing
tokens or history: read-only everywhere.
"""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from assignments.matrix import build_matrix, liveness
from assignments.models import ShardAssignment
from coordination.model import LIVE_STATUSES
from groups.models import Event, Group, ShardVersion, Stream, SweepRun, VersionState
from groups.services import (
    GROUP_CONFIG_FIELDS,
    ServiceError,
    create_group,
    update_group_config,
    validate_group_config,
)
from members.models import Member

try:  # written by the resharding work; the action is left out if it is not there
    from groups.resharding import start_reshard
except ImportError:  # pragma: no cover - depends on the tree
    start_reshard = None

_LIVE = [s.value for s in LIVE_STATUSES]


def _actor(request: HttpRequest) -> str:
    return request.user.get_username() or "admin"


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that only services write: viewable, never added, edited or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- streams -------------------------------------------------------------------------------------
def drain_progress(stream: Stream) -> list[dict[str, Any]]:
    """Per group and live version: shards drained and still held (§6.3–6.4)."""
    rows = (
        ShardAssignment.objects.filter(group__stream=stream)
        .exclude(shard__version__state=VersionState.RETIRED)
        .values("group__name", "shard__version__version", "shard__version__state")
        .annotate(
            total=Count("id"),
            drained=Count("id", filter=Q(drained_at__isnull=False)),
            held=Count("id", filter=Q(owner__isnull=False)),
        )
        .order_by("group__name", "shard__version__version")
    )
    return [
        {
            "group": r["group__name"], "version": r["shard__version__version"],
            "state": r["shard__version__state"], "total": r["total"], "drained": r["drained"],
            "held": r["held"],
        }
        for r in rows
    ]


class ShardVersionInline(ReadOnlyInline):
    model = ShardVersion
    fields = ("version", "shard_count", "state", "created_at", "sealed_at", "retired_at")
    readonly_fields = fields
    show_change_link = False


class ReshardForm(forms.Form):
    shards = forms.IntegerField(min_value=1, label="New shard count")


@admin.register(Stream)
class StreamAdmin(ReadOnlyAdmin):
    list_display = (
        "name", "state", "write_version", "shard_count", "versions_summary", "drain_summary",
        "metadata_epoch", "state_changed_at",
    )
    list_filter = ("state",)
    search_fields = ("name",)
    inlines = [ShardVersionInline]
    fields = (
        "name", "key_prefix", "state", "write_version", "shard_count", "metadata_epoch",
        "created_at", "state_changed_at", "drain_table",
    )
    readonly_fields = fields
    actions = ["start_reshard_action"] if start_reshard is not None else []

    def get_queryset(self, request: HttpRequest) -> QuerySet[Stream]:
        return super().get_queryset(request).prefetch_related("versions")

    @admin.display(description="shards")
    def shard_count(self, obj: Stream) -> int | None:
        for v in obj.versions.all():
            if v.version == obj.write_version:
                return v.shard_count
        return None

    @admin.display(description="versions")
    def versions_summary(self, obj: Stream) -> str:
        live = [v for v in obj.versions.all() if v.state != VersionState.RETIRED]
        return " → ".join(f"v{v.version} ({v.shard_count}, {v.state})" for v in live)

    @admin.display(description="drain progress")
    def drain_summary(self, obj: Stream) -> str:
        sealed = [r for r in drain_progress(obj) if r["state"] == VersionState.SEALED]
        if not sealed:
            return "—"
        return " · ".join(f"{r['group']} v{r['version']}: {r['drained']}/{r['total']}" for r in sealed)

    @admin.display(description="per-group drain progress")
    def drain_table(self, obj: Stream) -> str:
        rows = drain_progress(obj)
        if not rows:
            return "no groups"
        return format_html(
            '<table class="rsc-drain"><thead><tr><th>group</th><th>version</th><th>state</th>'
            "<th>drained</th><th>held</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "", "<tr><td>{}</td><td>v{}</td><td>{}</td><td>{} / {}</td><td>{}</td></tr>",
                ((r["group"], r["version"], r["state"], r["drained"], r["total"], r["held"]) for r in rows),
            ),
        )

    def has_reshard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("groups.change_stream")

    @admin.action(description="Start a reshard (asks for the new shard count)", permissions=["reshard"])
    def start_reshard_action(self, request: HttpRequest, queryset: QuerySet[Stream]) -> HttpResponse | None:
        if not self.has_reshard_permission(request):
            raise PermissionDenied
        streams = list(queryset)
        if len(streams) != 1:
            self.message_user(request, "Select exactly one stream to reshard.", messages.WARNING)
            return None
        stream = streams[0]
        form = ReshardForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            try:
                version = start_reshard(stream.name, form.cleaned_data["shards"], actor=_actor(request))
            except ServiceError as exc:
                self.message_user(request, f"Reshard of {stream.name} refused: {exc}", messages.ERROR)
                return None
            self.message_user(
                request,
                f"Reshard of {stream.name} started: version {version.version} with "
                f"{version.shard_count} shards; the sweep seals and drains the old version.",
                messages.SUCCESS,
            )
            return None
        return TemplateResponse(request, "admin/groups/stream/reshard.html", {
            **self.admin_site.each_context(request),
            "title": f"Reshard {stream.name}",
            "opts": self.model._meta,
            "stream": stream,
            "current": self.shard_count(stream),
            "form": form,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        })


# --- groups --------------------------------------------------------------------------------------
class GroupForm(forms.ModelForm):
    class Meta:
        model = Group
        fields = ["name", "stream", *GROUP_CONFIG_FIELDS]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        values = {f: data.get(f) for f in GROUP_CONFIG_FIELDS}
        if all(v is not None for v in values.values()):
            try:  # the service's own rules, for feedback on the form; it re-checks under the lock
                validate_group_config(**values)  # type: ignore[arg-type]
            except ServiceError as exc:
                raise ValidationError(str(exc)) from exc
        return data


class MemberInline(ReadOnlyInline):
    """Live members of the group (tombstones are on the Members page)."""

    model = Member
    fields = ("member_id", "status", "member_epoch", "client_id", "heartbeat", "revocation_deadline")
    readonly_fields = fields
    verbose_name_plural = "live members"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Member]:
        return super().get_queryset(request).filter(status__in=_LIVE).select_related("group").order_by("member_id")

    @admin.display(description="last heartbeat")
    def heartbeat(self, obj: Member) -> str:
        g = obj.group
        seconds, alive = liveness(obj.last_heartbeat_at, timezone.now(), g.heartbeat_interval_ms, g.session_timeout_ms)
        if seconds is None:
            return "never"
        return format_html('<span class="rsc-{}">{} s ago · {}</span>', alive.value, f"{seconds:.1f}", alive.value)


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    form = GroupForm
    list_display = (
        "name", "stream", "live_members", "group_epoch", "assignment_epoch", "metadata_epoch",
        "heartbeat_interval_ms", "session_timeout_ms", "matrix_link",
    )
    list_filter = ("stream",)
    search_fields = ("name", "stream__name")
    list_select_related = ("stream",)
    inlines = [MemberInline]
    epoch_fields = ("group_epoch", "assignment_epoch", "metadata_epoch", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Group]:
        return super().get_queryset(request).annotate(
            live_count=Count("members", filter=Q(members__status__in=_LIVE))
        )

    def get_fieldsets(self, request: HttpRequest, obj: Group | None = None) -> Any:
        config = (
            "Configuration",
            {
                "fields": GROUP_CONFIG_FIELDS,
                "description": "Saving raises metadataEpoch: members pick the change up through "
                "SYNC_METADATA on their next heartbeat (R7).",
            },
        )
        if obj is None:
            return [(None, {"fields": ("name", "stream")}), config]
        return [
            (None, {"fields": ("name", "stream", "matrix_link")}),
            config,
            ("Epochs (fencing tokens, read-only)", {"fields": self.epoch_fields}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Group | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("name", "stream", "matrix_link", *self.epoch_fields)

    def has_delete_permission(self, request: HttpRequest, obj: Group | None = None) -> bool:
        return False  # deleting a group would drop members' fencing state without the core

    @admin.display(description="live members", ordering="live_count")
    def live_members(self, obj: Group) -> int:
        return getattr(obj, "live_count", 0)

    @admin.display(description="assignment matrix")
    def matrix_link(self, obj: Group) -> str:
        if obj.pk is None:
            return "—"
        return format_html('<a href="{}">matrix</a>', reverse("admin:groups_group_matrix", args=[obj.pk]))

    def save_model(self, request: HttpRequest, obj: Group, form: forms.ModelForm, change: bool) -> None:
        data = form.cleaned_data
        if change:
            changed = {f: data[f] for f in GROUP_CONFIG_FIELDS if f in form.changed_data}
            saved = update_group_config(obj.name, actor=_actor(request), **changed)
        else:
            saved = create_group(obj.name, data["stream"].name, **{f: data[f] for f in GROUP_CONFIG_FIELDS})
        obj.pk = saved.pk
        obj.refresh_from_db()

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # A service refusal after the form validated (a concurrent edit) rolls the whole
        # admin transaction back and shows why, instead of a 500.
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ServiceError as exc:
            self.message_user(request, f"Not saved: {exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def get_urls(self) -> list[Any]:
        return [
            path("<path:object_id>/matrix/", self.admin_site.admin_view(self.matrix_view),
                 name="groups_group_matrix"),
            *super().get_urls(),
        ]

    def matrix_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        group = self.get_object(request, object_id)
        if group is None:
            return self._get_obj_does_not_exist_redirect(request, self.model._meta, object_id)
        if not self.has_view_permission(request, group):
            raise PermissionDenied
        now = timezone.now()
        matrix = build_matrix(group, now)
        refresh = request.GET.get("refresh", "")
        events = Event.objects.filter(group=group).order_by("-created_at", "-id")[:15]
        return TemplateResponse(request, "admin/groups/group/matrix.html", {
            **self.admin_site.each_context(request),
            "title": f"Assignment matrix: {group.name}",
            "opts": self.model._meta,
            "original": group,
            "group": group,
            "matrix": matrix,
            "totals": matrix.totals,
            "events": events,
            "now": now,
            "refresh": int(refresh) if refresh.isdigit() and 0 < int(refresh) <= 300 else None,
            "members_url": reverse("admin:members_member_changelist") + f"?group__id__exact={group.pk}",
        })


# --- event log -----------------------------------------------------------------------------------
@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at", "kind", "group", "stream", "member_id", "group_epoch", "member_epoch", "actor", "summary",
    )
    list_filter = ("kind", "group", "stream")
    search_fields = ("member_id", "actor", "group__name", "stream__name")
    list_select_related = ("group", "stream")
    date_hierarchy = "created_at"
    show_full_result_count = False  # the log grows without bound; skip the second COUNT(*)
    readonly_fields = (
        "created_at", "kind", "group", "stream", "member_id", "group_epoch", "member_epoch", "actor", "detail",
    )
    fields = readonly_fields

    @admin.display(description="detail")
    def summary(self, obj: Event) -> str:
        return ", ".join(f"{k}={v}" for k, v in (obj.detail or {}).items())


# --- sweeps --------------------------------------------------------------------------------------
@admin.register(SweepRun)
class SweepRunAdmin(ReadOnlyAdmin):
    list_display = ("name", "last_started_at", "last_finished_at", "lag", "last_result")
    readonly_fields = ("name", "last_started_at", "last_finished_at", "lag", "last_result")
    fields = readonly_fields

    @admin.display(description="seconds since last finished")
    def lag(self, obj: SweepRun) -> str:
        if obj.last_finished_at is None:
            return "never finished"
        return f"{(timezone.now() - obj.last_finished_at).total_seconds():.1f}"

from groups import admin_keys  # noqa: E402, F401  (API keys: registered in their own module)
