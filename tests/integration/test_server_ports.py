"""The test servers' port check: a port another process took first is not this server's
(running_gunicorn tries another; seen once in CI, a test read another test's server)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests import plain_http

from .conftest import listens_on, running_gunicorn


def test_the_process_that_holds_a_listening_socket_is_told_apart_from_another():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listens_on(os.getpid(), port)
            assert not listens_on(other.pid, port)
        finally:
            other.kill()
            other.wait()
    assert not listens_on(os.getpid(), port)  # closed


def test_a_connected_socket_on_the_port_is_not_a_listener():
    with socket.socket() as listener, socket.socket() as client:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client.connect(listener.getsockname())
        _, client_port = client.getsockname()
        assert not listens_on(os.getpid(), client_port)


def test_a_server_whose_port_another_server_answers_on_is_refused(transactional_db):
    """The second server's readiness poll is answered by the first, which holds the port: the
    second is stopped and the test told, instead of talking to the first."""
    with running_gunicorn(workers=1) as first:
        port = int(first.url.rsplit(":", 1)[1])
        with pytest.raises(RuntimeError, match="another process holds it"), \
                running_gunicorn(port=port, workers=1) as second:
            pytest.fail(f"a second server was handed out on {second.url}, which the first holds")
        assert plain_http.get(f"{first.url}/healthz", timeout=5).status_code == 200
