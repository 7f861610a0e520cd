"""Admin page for API keys: who holds what, when last used, and a revoke action.

Keys are created, rotated and revoked only by the services in groups.services (the same ones
the management commands call); the page never shows or edits a key or its hash.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from groups.models import ApiKey
from groups.services import KEY_CACHE_SECONDS, key_is_active, revoke_api_key

REVOKE_PERMISSION = "groups.change_apikey"


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "scope", "target", "created_at", "last_used_at", "revoked_at",
                    "expires_at", "state")
    list_filter = ("scope", "revoked_at")
    search_fields = ("prefix", "name", "group__name", "stream__name")
    list_select_related = ("group", "stream")
    ordering = ("-created_at", "-id")
    fields = ("prefix", "name", "scope", "group", "stream", "created_at", "last_used_at", "revoked_at",
              "expires_at")
    readonly_fields = fields
    actions = ["revoke_keys"]

    @admin.display(description="group / stream")
    def target(self, key: ApiKey) -> str:
        return key.target()

    @admin.display(description="state")
    def state(self, key: ApiKey) -> str:
        if key.revoked_at:
            return "revoked"
        return "active" if key_is_active(key) else "expired"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are shown once, so they are made where they can be copied: the CLI

    def has_change_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # revoke instead: the row is the audit trail

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REVOKE_PERMISSION)

    @admin.action(description="Revoke selected API keys", permissions=["revoke"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        actor = request.user.get_username() or "admin"
        now = timezone.now()
        revoked = [revoke_api_key(key, actor=f"admin:{actor}").prefix for key in queryset
                   if key_is_active(key, now)]
        if revoked:
            self.message_user(
                request,
                f"Revoked {', '.join(revoked)}; every web worker refuses them within {KEY_CACHE_SECONDS:g} s.",
                messages.SUCCESS,
            )
        else:
            self.message_user(request, "Nothing to revoke: the selected keys were already revoked or expired.",
                              messages.WARNING)
