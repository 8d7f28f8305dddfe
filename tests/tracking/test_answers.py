"""``store.answers``: one short request says whether an MLflow server is up, where a call to a server that is down
waits out MLflow's retries. An answer is a success reply to ``/health`` (as the pre-flight's ``check_tracking``); no
reply, or a proxy's 503, is none."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from ropim.tracking import store


@pytest.fixture
def server():
    """A local HTTP server whose ``/health`` replies with ``status["code"]``; yields (its URI, status)."""
    status = {"code": 200}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the handler's name)
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", status
    httpd.shutdown()
    httpd.server_close()


def test_a_server_answers_and_a_down_one_does_not(server, tmp_path):
    uri, status = server
    assert store.answers(uri) and store.answers(uri + "/")
    status["code"] = 503  # a proxy in front of a server that is down
    assert not store.answers(uri)
    with socket.socket() as s:  # a port nothing listens on: refused at once, not after retries
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    assert not store.answers(closed)
    assert time.monotonic() - t0 < 5
    assert store.answers(f"sqlite:///{tmp_path / 'mlflow.db'}")  # a local store: its folder is there
    assert not store.answers(f"sqlite:///{tmp_path / 'gone' / 'mlflow.db'}")
