"""Prometheus `/metrics` for both daemons, served on the daemon's own event loop.

The page is rendered on the loop that owns the state it reads (the master's table, the node's
counters), so a scrape never races a mutation and needs no locks; rendering is cheap (one pass
over segments and counter dicts).  Metric names are `mooncake_*` with their unit in the name
(`_bytes`, `_seconds`, `_total`).  The text format is prometheus_client's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

log = logging.getLogger("mooncake.metrics")

disable_created_metrics()  # no `_created` series beside every counter: they only add noise

# Latency buckets of control calls: ~50 us (a framed call) to 10 s (a stuck commit).
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
)  # fmt: skip

_MAX_REQUEST_BYTES = 8192


class MetricsServer:
    """A minimal HTTP/1.1 server: `GET /metrics` renders `registry`; anything else is a 404."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > _MAX_REQUEST_BYTES:
                return
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1].split(b"?")[0]) if len(parts) >= 2 else (b"", b"")
            if method in (b"GET", b"HEAD") and path == b"/metrics":
                body = generate_latest(self.registry)
                status, ctype = b"200 OK", CONTENT_TYPE_LATEST.encode()
            else:
                body = b"not found: the metrics are at /metrics\n"
                status, ctype = b"404 Not Found", b"text/plain; charset=utf-8"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype
                + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n" + (body if method != b"HEAD" else b"")
            )  # fmt: skip
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        except Exception:
            log.exception("rendering /metrics failed")
        finally:
            writer.close()


async def start_metrics(
    registry: CollectorRegistry, host: str, port: int, what: str
) -> MetricsServer | None:
    """Serve `registry` on host:port (0: a free port; -1: off); log where."""
    if port < 0:
        return None
    server = MetricsServer(registry)
    bound = await server.start(host, port)
    log.info("%s metrics on http://%s:%d/metrics", what, host, bound)
    return server


def url(host: str, server: MetricsServer | None) -> str:
    """`, metrics http://host:port/metrics` for a start-up line, or '' when off."""
    return f", metrics http://{host}:{server.port}/metrics" if server is not None else ""


Render = Callable[[], bytes]
