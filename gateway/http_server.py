"""The REST door's HTTP server: uvicorn, stopped by the gateway's own signal handlers, on an
HTTP/1.1 protocol with a header timeout (uvicorn's h11 protocol with a timer); HTTPS with the
gateway's --tls-cert/--tls-key (and client certificates required with --tls-front-door-ca),
whose rotated files `HttpsContext` loads into the live context within a second.

uvicorn closes an idle keep-alive connection, but a client that has sent part of a request's
headers is waited for forever. Here every connection must deliver a request's complete headers
within `header_timeout_s` of opening (or of its previous response); otherwise it is closed. The
body's own deadline is gateway/limits.py's."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.config import GatewayConfig
from splitspec.tls import ServerTls


class HttpsContext:
    """The REST door's TLS context, following its certificate files: a change that passes the
    checks (splitspec/tls.py) is loaded into the live context, so connections opened after it
    get the new certificate and open ones carry on."""

    def __init__(self, tls: ServerTls):
        self.tls = tls
        self.context = tls.ssl_context()
        self._generation = tls.files.generation
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow(),
                                                            name="https-certificates")

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.tls.files.check_interval_s)
            self._generation = self.tls.reload(self.context, self._generation)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def rest_server(app: Starlette, config: GatewayConfig,
                https: HttpsContext | None = None) -> uvicorn.Server:
    """The server of the REST app on --host/--http-port (HTTPS with `https`). SIGINT and SIGTERM
    make it stop taking connections and return from serve() once its requests in flight have
    finished, so that the gateway stops the rest after it (gateway/lifecycle.py)."""
    factory = (lambda _config, _default: https.context) if https is not None else None
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.http_port,
                                           http=timed_h11(config.header_timeout_s),
                                           log_level=config.log_level.lower(),
                                           access_log=False, ssl_context_factory=factory))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # ours below
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    return server


def timed_h11(header_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol class with the given header timeout (0: none)."""

    class TimedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _waiting_cycle: Any = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()  # may start a pipelined request's cycle
            if self.cycle is done and not self.transport.is_closing():
                self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self._header_timer is not None and self.cycle is not self._waiting_cycle:
                self._disarm()  # a request's headers are in: its cycle started

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            if header_timeout_s > 0:
                self._waiting_cycle = self.cycle
                self._header_timer = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if self.cycle is self._waiting_cycle and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol
