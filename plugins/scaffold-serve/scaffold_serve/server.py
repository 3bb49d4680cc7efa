"""Running the app under uvicorn: in the background of an event loop (the controller, tests), bound before it starts.

The socket is bound here, so the port is known (``port=0`` picks a free one) and a
port that is taken fails at once with a clear error. Binding anywhere but loopback
needs an API key (:func:`check_bind`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from typing import Any

from scaffold_core.distributed.net import format_url
from scaffold_core.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse a non-loopback bind without an API key (anyone who can reach it could use the model and the sessions)."""
    if not is_loopback(host) and not api_key:
        raise ConfigError(f"refusing to serve on {host} without an API key: anyone who can reach this machine could "
                          "use the model and read or write its sessions; pass --api-key KEY (or set "
                          "SCAFFOLD_API_KEY), or bind 127.0.0.1")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6); a clear error when the port is taken."""
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port "
                          "(0 picks a free one)") from None
    sock.setblocking(False)
    return sock


def _server_class(quiet_signals: bool) -> Any:
    import uvicorn

    if not quiet_signals:
        return uvicorn.Server

    class QuietServer(uvicorn.Server):
        """A uvicorn server that leaves signal handling to its host process (a run, a test)."""

        def capture_signals(self) -> Any:
            return contextlib.nullcontext()

    return QuietServer


def uvicorn_config(app: Any, *, log_level: str = "warning", access_log: bool = False) -> Any:
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="off",
                          timeout_graceful_shutdown=5, timeout_keep_alive=30, server_header=False)


class BackgroundServer:
    """The app served on the running event loop, until :meth:`stop`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, quiet_signals: bool = True,
                 log_level: str = "warning"):
        self.app = app
        self.host = host
        self.port = port
        self.quiet_signals = quiet_signals
        self.log_level = log_level
        self.server: Any = None
        self.task: asyncio.Task | None = None
        self.sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return format_url("http", self.host, self.port)

    async def start(self, timeout: float = 30.0) -> BackgroundServer:
        self.sock = bind(self.host, self.port)
        self.port = self.sock.getsockname()[1]
        self.server = _server_class(self.quiet_signals)(uvicorn_config(self.app, log_level=self.log_level))
        self.task = asyncio.ensure_future(self.server.serve(sockets=[self.sock]))
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.server.started:
            if self.task.done():
                self.task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped while starting")
            if asyncio.get_running_loop().time() > deadline:
                await self.stop()
                raise TimeoutError(f"the HTTP server did not start within {timeout:g} s")
            await asyncio.sleep(0.01)
        return self

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (connections closed, requests in flight given ``timeout``); safe to call twice."""
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout)
            except (asyncio.TimeoutError, TimeoutError):
                self.server.force_exit = True
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await self.task
            except Exception:
                pass
        if self.sock is not None:
            self.sock.close()
        self.server, self.task, self.sock = None, None, None
