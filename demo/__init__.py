"""The demo producer and handler `make run` starts (uses only the data-plane library)."""
