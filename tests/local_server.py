"""A request handler served on a free 127.0.0.1 port, for the fake servers of the tests.

:class:`LocalServer` runs one thread per connection (a slow reply does not hold up the others),
with a backlog for many clients opening at once; a client that hangs up (a timeout, a reply over
its cap) is expected, not an error. Used as a context manager: serving from ``__enter__`` to
``__exit__``.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog (5) resets connections when many clients open at once
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that hung up (a timeout, a reply over its cap): expected here
        super().handle_error(request, client_address)


class LocalServer:
    """Serves ``handler`` on a free 127.0.0.1 port in a daemon thread; :attr:`root` is its address."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
