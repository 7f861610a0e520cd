"""Admin template helpers: times to the second plus relative age, and the index dashboard."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html

from groups.dashboard import dashboard

register = template.Library()


def ago(seconds: float) -> str:
    """12 s ago, 4 min ago, 3 h ago, 2 d ago (rounded down; negative clock skew: 'now')."""
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172_800:
        return f"{s // 3600} h ago"
    return f"{s // 86_400} d ago"


@register.filter
def when(value: datetime | None) -> str:
    """`2026-12-02 18:40:12 UTC (12 s ago)`, with the exact time as the tooltip's ISO form."""
    if value is None:
        return "—"
    now = timezone.now()
    local = timezone.localtime(value)
    return format_html(
        '<time datetime="{}" title="{}">{} <small>({})</small></time>',
        value.isoformat(), value.isoformat(), local.strftime("%Y-%m-%d %H:%M:%S %Z"),
        ago((now - value).total_seconds()),
    )


@register.filter
def num(value: int | None) -> str:
    """Thousands separated; an em dash for unknown."""
    return "—" if value is None else f"{value:,}"


@register.simple_tag(takes_context=True)
def rsc_dashboard(context: dict[str, Any]) -> dict[str, Any] | None:
    request = context.get("request")
    if request is None or not request.user.has_perm("groups.view_group"):
        return None
    return dashboard(timezone.now())
