"""Serve one engine's ``/metrics`` on a port of its own, and nothing else.

vLLM serves ``/metrics`` on its API port, next to routes its API key does not guard
(``/invocations``, ``/tokenize``, and with the trainer on the dev endpoints that reload
weights). A scraper allowed onto that port could call all of them. In the chart this
relay runs beside each engine (``python -m serving.metrics_relay PORT UPSTREAM``): the
monitoring namespace may reach the relay's port only, and the relay forwards exactly one
request, ``GET /metrics``, to the engine on localhost. Standard library only, so it
starts in a moment and adds nothing to the image.
"""

from __future__ import annotations

import argparse
import shutil
import urllib.error
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: The engine's own scrape takes milliseconds; Prometheus gives up after its interval.
UPSTREAM_TIMEOUT_S = 10.0


def make_handler(upstream: str) -> type[BaseHTTPRequestHandler]:
    """A handler that answers ``GET /metrics`` from ``upstream`` (a full URL) and 404
    to anything else."""

    class MetricsRelay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            try:
                with urllib.request.urlopen(upstream, timeout=UPSTREAM_TIMEOUT_S) as reply:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.headers.get("Content-Type", ""))
                    self.end_headers()
                    shutil.copyfileobj(reply, self.wfile)
            except (urllib.error.URLError, OSError) as exc:
                self.send_error(HTTPStatus.BAD_GATEWAY, f"engine metrics: {type(exc).__name__}")

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would be all the log there is

    return MetricsRelay


def serve(port: int, upstream: str, host: str = "0.0.0.0") -> None:
    with ThreadingHTTPServer((host, port), make_handler(upstream)) as server:
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("port", type=int, help="port to serve /metrics on")
    parser.add_argument(
        "upstream", help="the engine's metrics URL, e.g. http://127.0.0.1:8000/metrics"
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind")
    args = parser.parse_args(argv)
    serve(args.port, args.upstream, args.host)


if __name__ == "__main__":
    main()
