"""The message handed to handlers (PROTOCOL.md §7.1)."""

from __future__ import annotations

# A field ``dlq replay`` adds: the one group that is to handle the re-appended message. The
# replay goes to the shared stream, which every group reads; members of the other groups ACK
# such an entry without running their handler (issue 27.7, runtime ``Dispatcher``).
REPLAY_FOR = "dlq:replay-for"


class Message:
    """One stream entry. A plain slotted class: the runtime builds one per entry read, so it
    must be cheap to create (a frozen dataclass costs several times more)."""

    __slots__ = ("delivery_count", "fields", "id", "key", "shard")

    def __init__(
        self, shard: str, id: str, key: str, fields: dict[str, str], delivery_count: int = 1
    ) -> None:
        self.shard = shard  # shard id, e.g. "orders:3:5"
        self.id = id  # stream entry id
        self.key = key  # value of the key field (the entry id when the field is missing)
        self.fields = fields
        # Deliveries so far, this one included: Redis's count for recovered entries, 1 for new
        # ones, plus the local retries of the handler.
        self.delivery_count = delivery_count

    def __repr__(self) -> str:
        return (
            f"Message(shard={self.shard!r}, id={self.id!r}, key={self.key!r}, "
            f"delivery_count={self.delivery_count}, fields={self.fields!r})"
        )
