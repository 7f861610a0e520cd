"""The error every coordinator service raises for bad input or a refused operation.

Its own module, at the bottom of the layers (docs/ARCHITECTURE.md, Layers): every service
of every app raises it, and views, admin and commands catch it, so it must import nothing.
"""
from __future__ import annotations


class ServiceError(ValueError):
    """Bad input to a service: the message names the field and is safe to show."""
