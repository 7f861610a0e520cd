"""Member data-plane of the Redis Stream Coordinator (PROTOCOL.md §7).

Public surface (§7.1): ``from dataplane import Consumer, Producer, Message``.
"""

__version__ = "0.1.0"
