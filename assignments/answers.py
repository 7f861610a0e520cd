"""What the heartbeat service answers: frozen, typed values the view hands to one encoder
(`assignments.encoder`), which alone builds, memoizes and renders the wire body."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from coordination.model import HeartbeatResponse


class WireBody(dict[str, Any]):
    """A heartbeat's wire body (§3), with its bytes once rendered (`rendered`): a memoized
    steady answer's body is given to many heartbeats as is, and rendered once."""

    __slots__ = ("rendered",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rendered: bytes | None = None


@dataclass(eq=False)
class WireMemo:
    """The one slot for the wire form of an answer given many times (a memoized steady
    answer): `assignments.encoder` fills it on the first answer and reuses it after."""

    body: WireBody | None = None


@dataclass(frozen=True)
class SteadyAnswer:
    """A steady heartbeat's answer from the lock-free path (`assignments.fastpath`)."""

    response: HeartbeatResponse
    metadata_epoch: int
    memo: WireMemo = field(default_factory=WireMemo, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class HeartbeatResult:
    """The service's answer to one heartbeat."""

    response: HeartbeatResponse
    # {"metadataEpoch": n}, or the whole metadata document (R7, joins:
    # groups.metadata.group_metadata); None on errors.
    metadata: dict[str, Any] | None
    path: Literal["fast", "locked"] = "locked"  # fast: answered without the group lock
    memo: WireMemo | None = None  # a memoized steady answer's wire form (the encoder's)
