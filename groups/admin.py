"""Admin for streams, groups, the event log and sweep runs (staff only).

Every write goes through a service (create_group, update_group_config, start_reshard), so
the admin applies the same rules as the CLI. Epochs, grant epochs and timestamps are fencing
tokens or history: read-only everywhere.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth.models import Group as AuthGroup
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from assignments.matrix import Matrix, MemberRow, PagedRows, ShardColumn, build_matrix
from assignments.selectors import drain_progress
from coordination.liveness import NEEDS_ATTENTION, Liveness
from groups import selectors, shardstats
from groups.admin_base import ReadOnlyAdmin, ReadOnlyInline, actor_of, when_column
from groups.describe import shard_state
from groups.models import Event, Group, ShardVersion, Stream, SweepRun, VersionState
from groups.positions import reset_position
from groups.resharding import start_reshard
from groups.services import (
    GROUP_CONFIG_FIELDS,
    ServiceError,
    create_group,
    pause_group,
    resume_group,
    update_group_config,
    validate_group_config,
)


# --- streams -------------------------------------------------------------------------------------
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
        "metadata_epoch", "state_since",
    )
    list_filter = ("state",)
    search_fields = ("name",)
    inlines = [ShardVersionInline]
    fields = (
        "name", "key_prefix", "state", "write_version", "shard_count", "metadata_epoch",
        "created_at", "state_since", "drain_table",
    )
    readonly_fields = fields
    state_since = when_column("state_changed_at", "state since")
    actions = ["start_reshard_action"]

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

    def get_urls(self) -> list[Any]:
        return [
            path("<path:object_id>/reshard/", self.admin_site.admin_view(self.reshard_view),
                 name="groups_stream_reshard"),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = {"can_reshard": self.has_reshard_permission(request)}
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **extra})

    def reshard_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The stream page's Reshard button: asks for the count, then calls start_reshard."""
        stream = self.get_object(request, object_id)
        if stream is None:
            # ModelAdmin's own (private) "doesn't exist" redirect, as its change view answers.
            return self._get_obj_does_not_exist_redirect(  # type: ignore[attr-defined]
                request, self.model._meta, object_id
            )
        if not self.has_reshard_permission(request):
            raise PermissionDenied
        form = ReshardForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            change_url = reverse("admin:groups_stream_change", args=[stream.pk])
            try:
                version = start_reshard(stream.name, form.cleaned_data["shards"], actor=actor_of(request))
            except ServiceError as exc:
                self.message_user(request, f"Reshard of {stream.name} refused: {exc}", messages.ERROR)
                return HttpResponseRedirect(change_url)
            self.message_user(
                request,
                f"Reshard of {stream.name} started: version {version.version} with "
                f"{version.shard_count} shards; the sweep seals and drains the old version.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(change_url)
        return TemplateResponse(request, "admin/groups/stream/reshard.html", {
            **self.admin_site.each_context(request),
            "title": f"Reshard {stream.name}",
            "opts": self.model._meta,
            "stream": stream,
            "current": self.shard_count(stream),
            "form": form,
        })

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
                version = start_reshard(stream.name, form.cleaned_data["shards"], actor=actor_of(request))
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
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        })


# --- groups --------------------------------------------------------------------------------------
class GroupForm(forms.ModelForm):
    class Meta:
        model = Group
        fields = ["name", "stream", *GROUP_CONFIG_FIELDS]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns (django-stubs: Form's dict | None)
        values = {f: data.get(f) for f in GROUP_CONFIG_FIELDS}
        if all(v is not None for v in values.values()):
            try:  # the service's own rules, for feedback on the form; it re-checks under the lock
                validate_group_config(**values)  # type: ignore[arg-type]
            except ServiceError as exc:
                raise ValidationError(str(exc)) from exc
        return data


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    form = GroupForm
    list_display = (
        "name", "stream", "live_members", "group_epoch", "assignment_epoch", "metadata_epoch",
        "heartbeat_interval_ms", "session_timeout_ms", "paused", "matrix_link",
    )
    list_filter = ("stream",)
    search_fields = ("name", "stream__name")
    list_select_related = ("stream",)
    actions = ["reset_position_action", "pause_action", "resume_action"]
    epoch_fields = ("group_epoch", "assignment_epoch", "metadata_epoch", "created_at", "paused_at", "paused_by")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Group]:
        return selectors.with_live_member_counts(super().get_queryset(request))

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

    @admin.display(description="paused", boolean=True, ordering="paused_at")
    def paused(self, obj: Group) -> bool:
        return obj.paused_at is not None

    # --- pause and resume (§11) -------------------------------------------------------------
    @admin.action(description="Pause: members finish in-flight work, then read nothing (keep shards)",
                  permissions=["reset"])
    def pause_action(self, request: HttpRequest, queryset: QuerySet[Group]) -> None:
        self._pause_or_resume(request, queryset, pause=True)

    @admin.action(description="Resume: members of a paused group read again", permissions=["reset"])
    def resume_action(self, request: HttpRequest, queryset: QuerySet[Group]) -> None:
        self._pause_or_resume(request, queryset, pause=False)

    def _pause_or_resume(self, request: HttpRequest, queryset: QuerySet[Group], *, pause: bool) -> None:
        if not self.has_reset_permission(request):
            raise PermissionDenied
        done: list[str] = []
        unchanged: list[str] = []
        for name in queryset.values_list("name", flat=True):
            try:
                changed = (pause_group if pause else resume_group)(name, actor=actor_of(request))
            except ServiceError as exc:
                self.message_user(request, f"{name}: {exc}", messages.ERROR)
                continue
            (done if changed else unchanged).append(name)
        verb = "paused" if pause else "resumed"
        if done:
            self.message_user(request, f"{verb}: {', '.join(done)}", messages.SUCCESS)
        if unchanged:
            state = "already paused" if pause else "not paused"
            self.message_user(request, f"{state}: {', '.join(unchanged)}", messages.INFO)

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
            saved = update_group_config(obj.name, actor=actor_of(request), **changed)
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

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        group = self.get_object(request, object_id)
        if group is not None and request.method == "GET":
            now = timezone.now()
            matrix = build_matrix(group, now, full=False)
            extra_context = {**(extra_context or {}), **group_page_context(group, matrix, now, request)}
        return super().change_view(request, object_id, form_url, extra_context)

    def matrix_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        group = self.get_object(request, object_id)
        if group is None:
            # ModelAdmin's own (private) "doesn't exist" redirect, as its change view answers.
            return self._get_obj_does_not_exist_redirect(  # type: ignore[attr-defined]
                request, self.model._meta, object_id
            )
        if not self.has_view_permission(request, group):
            raise PermissionDenied
        now = timezone.now()
        matrix = build_matrix(group, now)
        refresh = request.GET.get("refresh", "")
        shard_filter = ShardFilter.from_query(request.GET)
        shards = [c for c in matrix.columns if shard_filter.keep(c)]
        shard_page = Paginator(shards, SHARDS_PER_PAGE).get_page(request.GET.get("page"))
        return TemplateResponse(request, "admin/groups/group/matrix.html", {
            **self.admin_site.each_context(request),
            **group_page_context(group, matrix, now, request),
            "title": f"Assignment matrix: {group.name}",
            "opts": self.model._meta,
            "original": group,
            "shard_filter": shard_filter,
            "filtered_shards": len(shards),
            "shard_page": shard_page,
            # Every filtered shard a tile up to HEAT_GRID_MAX; beyond, this page's (issue 26.3).
            "heat_grid": heat_grid(shards if len(shards) <= HEAT_GRID_MAX else list(shard_page)),
            "heat_grid_paged": len(shards) > HEAT_GRID_MAX,
            "refresh": int(refresh) if refresh.isdigit() and 0 < int(refresh) <= 300 else None,
        })

    # --- position reset (like kafka-consumer-groups --reset-offsets) ---------------------------
    def has_reset_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("groups.change_group")

    @admin.action(description="Reset position (asks where to; refused while members are live)",
                  permissions=["reset"])
    def reset_position_action(self, request: HttpRequest, queryset: QuerySet[Group]) -> HttpResponse | None:
        if not self.has_reset_permission(request):
            raise PermissionDenied
        groups = list(queryset.select_related("stream"))
        if len(groups) != 1:
            self.message_user(request, "Select exactly one group to reset.", messages.WARNING)
            return None
        group = groups[0]
        form = ResetPositionForm(request.POST if "to" in request.POST else None, group=group)
        plan = None
        if form.is_bound and form.is_valid():
            confirmed = request.POST.get("confirm") == "yes"
            try:
                plan = reset_position(group.name, form.cleaned_data["to"], shard=form.cleaned_data["shard"] or None,
                                      dry_run=not confirmed, actor=actor_of(request))
            except ServiceError as exc:
                self.message_user(request, f"Reset of {group.name} refused: {exc}", messages.ERROR)
                return None
            if confirmed:
                self.message_user(request, "; ".join(plan.lines()[:1]) + ".", messages.SUCCESS)
                return None
        return TemplateResponse(request, "admin/groups/group/reset_position.html", {
            **self.admin_site.each_context(request),
            "title": f"Reset the position of {group.name}",
            "opts": self.model._meta,
            "group": group,
            "form": form,
            "plan": plan,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        })


class ResetPositionForm(forms.Form):
    to = forms.CharField(
        label="Reset to", initial="latest",
        help_text="earliest, latest, an entry ID (delivery resumes after it) or an ISO date-time (UTC if no zone)",
    )
    shard = forms.CharField(required=False, label="Only shard", help_text="a shard id; empty: every live shard")

    def __init__(self, *args: Any, group: Group, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group


# --- the group page and the matrix: summaries, filters, paging ---------------------------------
SHARDS_PER_PAGE = 100
HEAT_GRID_MAX = 4096  # tiles in the matrix's shard grid; more filtered shards show a page's
MEMBERS_PER_PAGE = 100
SHARD_STATES = ("granted", "revoking", "unowned", "pending", "sealed", "drained", "waiting")


@dataclass(frozen=True)
class ShardFilter:
    member: str = ""
    state: str = ""
    version: str = ""
    lagging: bool = False

    @classmethod
    def from_query(cls, q: Any) -> ShardFilter:
        state = q.get("state", "")
        return cls(member=q.get("member", "").strip(), state=state if state in SHARD_STATES else "",
                   version=q.get("version", "").strip(), lagging=q.get("lagging") == "1")

    @property
    def active(self) -> bool:
        return bool(self.member or self.state or self.version or self.lagging)

    def keep(self, c: ShardColumn) -> bool:
        if self.member and self.member not in (c.owner, c.target):
            return False
        if self.version and str(c.version) != self.version:
            return False
        if self.lagging and not c.lag:
            return False
        if self.state == "pending":
            return c.target is not None and (c.owner != c.target or c.revoking)
        if self.state == "sealed":
            return c.sealed and not c.drained
        if self.state == "waiting":
            return not c.drained and not c.assignable
        return not self.state or shard_state(c) == self.state


def heat_grid(columns: list[ShardColumn]) -> str:
    """Every (filtered) shard as one small tile coloured by lag, grouped by version.

    Built as one string with the stdlib's escape: thousands of tiles through the template
    engine or format_html cost most of the page's time.
    """
    out: list[str] = []
    version = None
    for c in columns:
        if c.version != version:
            if version is not None:
                out.append("</div>")
            version = c.version
            out.append(f'<div class="rsc-grid" data-version="{version}"><span class="rsc-grid-v">v{version}</span>')
        kind = "drained" if c.drained else ("revoking" if c.revoking else ("unowned" if c.owner is None else ""))
        lag = "?" if c.lag is None else f"{c.lag}{'' if c.lag_exact else '+'}"
        pending = "?" if c.pending_entries is None else c.pending_entries
        owner = html.escape(c.owner or "")
        out.append(
            f'<a class="t {c.heat} {kind}" href="?member={quote(c.owner or "")}" title="{html.escape(c.shard_id)}'
            f' · {c.status} · owner {owner or "—"} · lag {lag} · pending {pending}"></a>'
        )
    if version is not None:
        out.append("</div>")
    return mark_safe("".join(out))  # noqa: S308 - every value is escaped above


def group_page_context(group: Group, matrix: Matrix, now: Any, request: HttpRequest) -> dict[str, Any]:
    stats = matrix.stats
    q = request.GET.get("mq", "").strip()
    alive = request.GET.get("liveness", "")
    rows: list[MemberRow] | PagedRows
    if matrix.paged_members is not None:  # a big group: members read a page at a time (26.3)
        rows = PagedRows(group, matrix, now, q, alive if alive in {v.value for v in Liveness} else "")
        late = PagedRows(group, matrix, now).late()
    else:
        rows = list(matrix.rows)
        if q:
            rows = [r for r in rows if q in r.member_id or q in r.client_id]
        if alive in {v.value for v in Liveness}:
            rows = [r for r in rows if r.liveness == alive]
        late = sum(r.liveness in NEEDS_ATTENTION for r in matrix.rows)
    dlq_shards = sorted((c for c in matrix.columns if c.dlq), key=lambda c: -(c.dlq or 0))[:20]
    dlq_entries: list[shardstats.DlqEntry] = []
    dlq_error: str | None = None
    if stats is not None and stats.ok and dlq_shards:
        dlq_entries, dlq_error = shardstats.newest_dlq_entries(group.name, group.stream.key_prefix, stats)
    return {
        "group": group,
        "matrix": matrix,
        "totals": matrix.totals,
        "stats": stats,
        "late_members": late,
        "member_page": Paginator(cast("list[MemberRow]", rows), MEMBERS_PER_PAGE).get_page(request.GET.get("mpage")),
        "member_query": q,
        "member_liveness": alive,
        "liveness_choices": [v.value for v in Liveness],
        "shard_states": SHARD_STATES,
        "waits_for": matrix.waits_for(group.stream.state),
        "dlq_shards": dlq_shards,
        "dlq_entries": dlq_entries,
        "dlq_error": dlq_error,
        "events": selectors.group_events(group),
        "now": now,
        "members_url": reverse("admin:members_member_changelist") + f"?group__id__exact={group.pk}",
        "stream_url": reverse("admin:groups_stream_change", args=[group.stream_id]),
    }


# --- event log -----------------------------------------------------------------------------------
@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = (
        "created", "kind", "group", "stream", "member_id", "group_epoch", "member_epoch", "actor", "summary",
    )
    created = when_column("created_at", "time")
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
    list_display = ("name", "started", "finished", "lag", "last_result")
    readonly_fields = ("name", "started", "finished", "lag", "last_result")
    fields = readonly_fields
    started = when_column("last_started_at", "last started")
    finished = when_column("last_finished_at", "last finished")

    @admin.display(description="seconds since last finished")
    def lag(self, obj: SweepRun) -> str:
        if obj.last_finished_at is None:
            return "never finished"
        return f"{(timezone.now() - obj.last_finished_at).total_seconds():.1f}"

from groups import admin_keys  # noqa: E402, F401  (API keys: registered in their own module)

# Issue 24.8: the coordinator has no site beyond the admin and the API, so the admin's "View
# site" link (to /) only led to a 404; and Django's permission "Groups" sat next to "Consumer
# groups" although staff get their permissions per user here.
admin.site.site_url = None
admin.site.unregister(AuthGroup)
