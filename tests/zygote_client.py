"""Run one program in the test zygote from a shell: ``python -I -S tests/zygote_client.py
manage.py ARGS...`` with the zygote's socket in RSC_TEST_ZYGOTE_SOCK (tests/spawn.py).

The docs' shell blocks run as printed in bash, and their ``.venv/bin/python manage.py ...``
lines reach this through a shell function the test defines (test_docs_blocks_run.Stack.sh):
the command is forked from the xdist worker's zygote, with this process's environment,
working directory and stdio, instead of a new interpreter importing Django again (~0.5 CPU-s a
command, decision 0019). It exits as the program did and passes SIGTERM, SIGINT and SIGHUP on.
Standard library only, and started with -I -S: its own start costs a few milliseconds."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys


def main() -> int:
    env = dict(os.environ)
    path = env.pop("RSC_TEST_ZYGOTE_SOCK")
    request = json.dumps({"argv": sys.argv[1:], "env": env, "cwd": os.getcwd(), "new_session": False}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    conn.sendmsg([struct.pack("!I", len(request))],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
    conn.sendall(request)
    child: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        for pid in child:
            os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    buf = b""
    while True:
        chunk = conn.recv(64)
        if not chunk:
            print("zygote_client: the test zygote went away", file=sys.stderr)
            return 1
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"P"):
                child.append(int(line[1:]))
            elif line.startswith(b"X"):
                return os.waitstatus_to_exitcode(int(line[1:]))


if __name__ == "__main__":
    sys.exit(main())
