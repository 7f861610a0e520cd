"""A member library Consumer's run() on a thread of its own, keeping what it raised."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dataplane import Consumer


@dataclass
class RunningConsumer:
    consumer: Consumer
    thread: threading.Thread
    raised: list[BaseException]  # what run() raised, if it did
    ended: list[float]  # when run() returned or raised (monotonic)


def run_consumer(consumer: Consumer, *, daemon: bool = True) -> RunningConsumer:
    """Start `consumer.run()`; a test asserts on `raised` after joining the thread. BaseException
    too: a run() that lets SystemExit or KeyboardInterrupt out is what some tests look for."""
    raised: list[BaseException] = []
    ended: list[float] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as exc:
            raised.append(exc)
        ended.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=daemon)
    thread.start()
    return RunningConsumer(consumer, thread, raised, ended)
