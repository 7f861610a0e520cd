"""The pure protocol core (PROTOCOL.md §4): no Django, no I/O, time passed in as `now`."""
