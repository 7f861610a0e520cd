"""What every app's admin shares: read-only model admins and inlines, the time column.

Its own module so the members and assignments admins need not import the groups admin
(one admin module per app, none importing another's).
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from groups.templatetags.rsc_admin import when


def when_column(attr: str, description: str) -> Any:
    """A list/detail column: the time to the second plus how long ago ("12 s ago")."""

    @admin.display(description=description, ordering=attr)
    def column(self: Any, obj: Any) -> str:
        return when(getattr(obj, attr))

    return column


def actor_of(request: HttpRequest) -> str:
    """Who acted, for the event log: the admin user's name."""
    return request.user.get_username() or "admin"


class ReadOnlyMixin:
    """Rows that only services write: viewable, never added, edited or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(ReadOnlyMixin, admin.ModelAdmin):
    pass


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
