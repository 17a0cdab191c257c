"""A real HTTP server on 127.0.0.1 for the tests: a folder's files behind basic authentication.

The standard library's ``ThreadingHTTPServer`` in a thread of the test process; fsspec's HTTP
filesystem (aiohttp) reads from it. A request without the right ``Authorization`` header gets
``401``; the passwords it takes can change while it runs (a rotated secret).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import pathlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class HTTPServer:
    """Where the server listens, its user and the passwords it takes now."""

    port: int
    user: str
    passwords: set[str] = field(default_factory=set)

    def url(self, name: str, password: str | None) -> str:
        """The URL of file ``name``, with ``user:password@`` in it (None: without)."""
        auth = f"{self.user}:{password}@" if password is not None else ""
        return f"http://{auth}127.0.0.1:{self.port}/{name}"


def _handler(server: HTTPServer) -> type[http.server.SimpleHTTPRequestHandler]:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def _allowed(self) -> bool:
            given = self.headers.get("Authorization", "")
            if any(given == "Basic " + base64.b64encode(f"{server.user}:{p}".encode()).decode()
                   for p in server.passwords):
                return True
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="data"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False

        def do_GET(self) -> None:
            if self._allowed():
                super().do_GET()

        def do_HEAD(self) -> None:
            if self._allowed():
                super().do_HEAD()

        def log_message(self, *args: object) -> None:  # quiet
            pass

    return Handler


@contextlib.contextmanager
def basic_auth_server(directory: pathlib.Path, user: str, password: str) -> Iterator[HTTPServer]:
    """Serve ``directory`` on a free port of 127.0.0.1 to ``user`` with ``password``."""
    server = HTTPServer(0, user, {password})
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_handler(server), directory=str(directory)))
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="test-http")
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
