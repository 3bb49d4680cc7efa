"""Start and stop inference server processes (a remote engine's ``engine.launch``).

What every server engine shares lives here; what one server needs (its
command, its flags, its environment) is a :class:`ServerSpec` its plugin
writes. Each server is started from an argument list, never a shell string,
in its own process group, with its output written to ``<output
dir>/<server>/``. Its ports (the HTTP port and ``spec.ports_per_server - 1``
more: SGLang's NCCL port, vLLM's internal port base) come from this worker's
own port slice (reserved by binding, released right before the server
starts), so two workers launching at once never collide. Readiness is the
health endpoint answering 200, while the process is alive, within
``setup_timeout``; the error of a server that exits or never becomes ready
carries the tail of its log. Every server is stopped (SIGTERM to the whole
group, SIGKILL after ``stop_timeout``) on close, on a failed start and on
Ctrl-C; on Linux a server also receives SIGTERM if the process that launched
it dies.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scaffold_core.distributed.net import format_url, loopback_host, strip_brackets
from scaffold_core.errors import ScaffoldError
from scaffold_core.output.redact import Redactor, copy_redacted, secret_values

log = logging.getLogger("scaffold.remote")

BIND_ERRORS = ("address already in use", "errno 98", "eaddrinuse", "could not bind")
LOG_TAIL_LINES = 40


class LaunchError(ScaffoldError):
    """Servers could not be started (the message carries the server's log tail)."""


class LaunchOptions(BaseModel):
    """``engine.launch``: which servers to start and how (a plugin subclasses it to name its managed flags)."""

    #: Flags scaffold sets itself -> what to use instead; giving one in extra_args is an error saying so.
    managed_flags: ClassVar[dict[str, str]] = {}

    model_config = ConfigDict(extra="forbid", validate_default=True)
    model_path: str = Field(description="model directory or hub id the servers load")
    count: int = Field(1, ge=1, description="servers this worker starts")
    tp: int = Field(1, ge=1, description="tensor-parallel GPUs per server")
    host: str | None = Field(None, description="address the servers bind (IPv6 raw, e.g. ::1 or fe80::1%eth0); "
                                                "default: the IPv4 loopback, or ::1 on an IPv6-only host")
    extra_args: list[str] = Field(default_factory=list, description="more arguments for the server command")
    command: list[str] | None = Field(None, description="command prefix; default: the server's own module run by "
                                                         "this Python")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the servers")
    assign_gpus: bool = Field(True, description="give the servers of one host distinct GPUs")
    use_api_key: bool = Field(False, description="start servers with --api-key from engine.api_key_env")
    stop_timeout: float = Field(30.0, gt=0, description="seconds between SIGTERM and SIGKILL")
    log_dir: str | None = Field(None, description="where server logs go; default <output dir>/<server>")

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in cls.managed_flags:
                raise ValueError(f"{flag} is set by scaffold; use {cls.managed_flags[flag]} instead")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(isinstance(a, str) and a for a in value)):
            raise ValueError("must be a non-empty list of arguments, e.g. [python, -m, my.server]")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str:
        return loopback_host() if value is None else strip_brackets(value)  # raw; bracketed only in URLs


def parse_launch_options(data: Any, options: type[LaunchOptions] = LaunchOptions) -> LaunchOptions:
    """Validate ``engine.launch`` as ``options``; errors name the key, the value and what is allowed."""
    if isinstance(data, options):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"engine.launch must be a mapping such as {{model_path: ..., count: 1}}, got {data!r}")
    from pydantic import ValidationError

    try:
        return options(**data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            key = loc.split(".")[0]
            if err.get("type") == "extra_forbidden":
                lines.append(f"engine.launch.{loc}: unknown key; allowed: {', '.join(options.model_fields)}")
            elif err.get("type") == "missing":
                lines.append(f"engine.launch.{loc}: required")
            else:
                msg = str(err.get("msg", "")).removeprefix("Value error, ")
                field_info = options.model_fields.get(key)
                allowed = f" ({field_info.description})" if field_info and field_info.description else ""
                lines.append(f"engine.launch.{loc}: {msg}; got {err.get('input')!r}{allowed}")
        raise ValueError("\n".join(lines)) from None


class ServerSpec:
    """What one kind of server needs to be launched: its plugin's half of the launcher.

    ``name`` names the server in logs, errors and the log directory;
    ``ports_per_server`` is how many ports each server gets from the worker's
    slice (the first is its HTTP port). ``command_prefix`` raises (naming how
    to install the server) when it is missing; ``argv`` is the whole
    argument list and ``env`` the variables a server gets beyond the
    launcher's environment.
    """

    name = "server"
    ports_per_server = 1

    def command_prefix(self, options: LaunchOptions) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def argv(self, options: LaunchOptions, prefix: list[str], index: int, host: str, ports: list[int],
             gpus: list[int], api_key: str | None) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def env(self, options: LaunchOptions, index: int, ports: list[int], gpus: list[int]) -> dict[str, str]:
        return {}


# ---------------------------------------------------------------------------
# One server process
# ---------------------------------------------------------------------------


@dataclass(eq=False)
class ServerProcess:
    """A launched server: its address, ports, process (group leader) and log file.

    ``ports[0]`` is its HTTP port; the others are what its :class:`ServerSpec`
    asked for (SGLang's NCCL port, vLLM's internal port base).
    """

    index: int
    host: str
    ports: list[int]
    argv: list[str]
    log_path: Path
    display: str = ""
    name: str = "server"
    #: Variables this server gets beyond the launcher's environment (its GPUs, its internal ports).
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    launches: int = 0
    last_probe: str = "not probed yet"
    #: Extra strings hidden in the log (the API key the server was started with).
    secrets: tuple[str, ...] = ()
    _copier: threading.Thread | None = field(default=None, repr=False)

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return format_url("http", self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"(could not read {self.log_path}: {exc})"
        tail = text.splitlines()[-lines:]
        return "\n".join("    " + line for line in tail) if tail else "    (the log is empty)"

    def start(self, env: dict[str, str]) -> None:
        """Start the server with ``env`` and its own variables; its output reaches the log (0600, never through a
        link) with secrets as ``***``."""
        env = {**env, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise LaunchError(f"cannot open the server log {self.log_path} ({exc}); if it is a symbolic link, "
                              "remove it: logs are never written through links") from exc
        shown = "".join(f"{k}={v} " for k, v in sorted(self.env.items()))
        os.write(fd, f"# scaffold: starting server {self.index}: {shown}{self.display}\n".encode())
        self.launches += 1
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )
        except OSError as exc:
            os.close(fd)
            raise LaunchError(f"cannot start {self.name} server {self.index} ({self.display}): {exc}") from exc
        redactor = Redactor([*secret_values(env), *self.secrets])
        self._copier = threading.Thread(target=copy_redacted, args=(self.proc.stdout, fd, redactor), daemon=True,
                                        name=f"scaffold-{self.name}-log-{self.index}")
        self._copier.start()
        _LIVE.add(self)

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self) -> None:
        """After the leader exited: kill what is left of its group, reap, close the log."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process immune to SIGKILL
                log.error("%s server pid %s did not exit after SIGKILL", self.name, self.proc.pid)
        if self._copier is not None:  # the pipe ends with the process group: the copier drains it and stops
            self._copier.join(timeout=10)
            self._copier = None
        _LIVE.discard(self)

    def stop(self, timeout: float) -> None:
        """Blocking stop: SIGTERM the group, wait up to ``timeout``, then SIGKILL it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.finish()


# Linux: a server gets SIGTERM when the thread that launched it dies (even by SIGKILL).
_PRCTL: Any = None
if sys.platform.startswith("linux"):
    try:
        _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # pragma: no cover - unusual libc
        _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


#: Every server started by this process and not yet stopped (stopped at interpreter exit).
_LIVE: set[ServerProcess] = set()


def live_servers() -> list[ServerProcess]:
    """Servers this process launched that are not stopped yet (tests check it is empty)."""
    return list(_LIVE)


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        server.stop(timeout=5.0)


# ---------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------


class Launcher:
    """Starts ``options.count`` servers of one kind (``spec``) for one worker and stops them all."""

    def __init__(self, options: LaunchOptions, spec: ServerSpec, *, port_range: tuple[int, int], log_dir: Path,
                 rank: int = 0, local_rank: int = 0, api_key: str | None = None):
        self.options = options
        self.spec = spec
        self.port_range = port_range
        self.log_dir = log_dir
        self.rank = rank
        self.local_rank = local_rank
        self.api_key = api_key
        self.servers: list[ServerProcess] = []
        self._used_ports: set[int] = set()
        self._prefix: list[str] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    # -- commands -----------------------------------------------------------
    def command_prefix(self) -> list[str]:
        if self._prefix is None:
            self._prefix = list(self.options.command) if self.options.command is not None \
                else self.spec.command_prefix(self.options)
        return self._prefix

    def gpus(self, index: int) -> list[int]:
        """The GPUs (indices on this host) server ``index`` of this worker uses: ``tp`` of them, after those of the
        workers with a lower local rank and of this worker's servers before it."""
        tp = self.options.tp
        first = (self.local_rank * self.options.count + index) * tp
        return list(range(first, first + tp))

    def argv(self, index: int, ports: list[int]) -> tuple[list[str], str]:
        """(argument list, the same for display with the API key redacted)."""
        o = self.options
        if o.use_api_key and not self.api_key:
            raise LaunchError("engine.launch.use_api_key is set but no API key is in the environment variable "
                              "named by engine.api_key_env")
        secret = self.api_key if o.use_api_key else None
        args = self.spec.argv(o, self.command_prefix(), index, o.host or loopback_host(), ports, self.gpus(index),
                              secret)
        shown = [("***" if secret is not None and a == secret else a) for a in args]
        return args, shlex.join(shown)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.options.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _reserve(self, count: int) -> list[Any]:
        from scaffold_core.distributed.ports import reserve_ports

        try:
            return reserve_ports(count, rank=0, world_size=1, host="", port_range=self.port_range,
                                 exclude=self._used_ports)
        except OSError as exc:
            raise LaunchError(f"cannot reserve {count} port(s) for {self.name} servers in this worker's range "
                              f"{self.port_range[0]}-{self.port_range[1]}: {exc}") from None

    def _place(self, server: ServerProcess, reservations: list[Any]) -> None:
        """Give ``server`` the reserved ports: its argument list and environment follow them."""
        ports = [r.port for r in reservations]
        self._used_ports.update(ports)
        server.ports = ports
        server.argv, server.display = self.argv(server.index, ports)
        server.env = {k: v for k, v in self.spec.env(self.options, server.index, ports, self.gpus(server.index)).items()
                      if k not in self.options.env}  # engine.launch.env wins
        for r in reservations:
            r.release()

    # -- starting -------------------------------------------------------------
    def start(self) -> list[ServerProcess]:
        """Reserve ports and start every server (returns at once; then ``await wait_ready``)."""
        o = self.options
        per = self.spec.ports_per_server
        self.command_prefix()  # fail before reserving anything when the server is not installed
        reservations = self._reserve(per * o.count)
        try:
            env = self._env()
            for i in range(o.count):
                log_path = self.log_dir / f"server-r{self.rank}-{i}.log"
                server = ServerProcess(i, o.host or loopback_host(), [], [], log_path, name=self.name,
                                       secrets=(self.api_key,) if self.api_key else ())
                self._place(server, reservations[per * i:per * (i + 1)])
                self.servers.append(server)
                server.start(env)
                log.info("started %s server %d (pid %s) at %s; log %s", self.name, i, server.pid, server.url,
                         server.log_path)
        except BaseException:
            for r in reservations:
                r.release()
            self.stop_now()
            raise
        return self.servers

    def _relaunch(self, server: ServerProcess) -> None:
        """Start ``server`` again on fresh ports (its ports were taken by someone else)."""
        server.finish()
        self._place(server, self._reserve(self.spec.ports_per_server))
        server.start(self._env())
        log.warning("%s server %d lost its port to another process; restarted on port %d", self.name, server.index,
                    server.port)

    async def wait_ready(self, probe: Callable[[str, str, float], Awaitable[str | None]], timeout: float,  # noqa: C901
                         path: str) -> None:
        """Poll every server's health endpoint until all answer 200; raise LaunchError with the log tail.

        Probes run concurrently with watching the processes, so a server that
        exits is reported at once, whatever its probe is doing.
        """
        started = time.monotonic()
        deadline = started + timeout
        pending = list(self.servers)
        probes: dict[ServerProcess, asyncio.Future] = {}
        next_probe = {s: started for s in pending}
        interval = {s: 0.1 for s in pending}
        next_note = started + 30.0
        try:
            while True:
                now = time.monotonic()
                for server in list(pending):
                    code = server.exit_code()
                    if code is None:
                        continue
                    if server in probes:
                        probes.pop(server).cancel()
                    tail = server.log_tail()
                    if server.launches < 3 and any(e in tail.lower() for e in BIND_ERRORS):
                        self._relaunch(server)
                        continue
                    raise LaunchError(
                        f"{self.name} server {server.index} ({server.url}) exited with code {code} before it was "
                        f"ready. Command: {server.display}\nLast lines of {server.log_path}:\n{tail}")
                for server, task in list(probes.items()):
                    if not task.done():
                        continue
                    del probes[server]
                    why = task.result()
                    if why is None and server.exit_code() is None:
                        pending.remove(server)
                        log.info("%s server %d at %s is ready (%.1f s)", self.name, server.index, server.url,
                                 now - started)
                    elif why is not None:
                        server.last_probe = why
                        next_probe[server] = now + interval[server]
                        interval[server] = min(interval[server] * 1.5, 2.0)
                if not pending:
                    return
                if now >= deadline:
                    first = pending[0]
                    raise LaunchError(
                        f"{len(pending)} {self.name} server(s) not ready within setup_timeout={timeout:g} s: "
                        + ", ".join(f"{s.url} ({s.last_probe})" for s in pending)
                        + f". Command: {first.display}\nLast lines of {first.log_path}:\n{first.log_tail()}")
                for server in pending:
                    if server not in probes and now >= next_probe[server]:
                        probe_timeout = max(0.1, min(10.0, deadline - now))
                        probes[server] = asyncio.ensure_future(probe(server.url, path, probe_timeout))
                if now >= next_note:
                    next_note += 30.0
                    log.warning("still waiting for %d %s server(s) after %.0f s (setup_timeout %g s): %s",
                                len(pending), self.name, now - started, timeout,
                                ", ".join(f"{s.url}: {s.last_probe}" for s in pending))
                await asyncio.sleep(max(0.0, min(0.05, deadline - now)))
        finally:
            for task in probes.values():
                task.cancel()

    # -- stopping -------------------------------------------------------------
    def stop_now(self, timeout: float | None = None) -> None:
        """Blocking stop of every server (SIGTERM all groups, wait, SIGKILL what is left)."""
        timeout = self.options.stop_timeout if timeout is None else timeout
        for server in self.servers:
            if server.exit_code() is None:
                server.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for server in self.servers:
            if server.proc is not None and server.exit_code() is None:
                try:
                    server.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            server.finish()

    async def stop(self, timeout: float | None = None) -> None:
        """Like :meth:`stop_now`, waiting without blocking the event loop."""
        timeout = self.options.stop_timeout if timeout is None else timeout
        for server in self.servers:
            if server.exit_code() is None:
                server.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(s.exit_code() is None for s in self.servers):
            await asyncio.sleep(0.05)
        for server in self.servers:
            server.finish()


def default_log_dir(output_dir: Path | None, configured: str | None, name: str) -> Path:
    """``launch.log_dir``, else ``<output dir>/<name>``, else a fresh temporary directory (kept)."""
    if configured:
        return Path(configured).expanduser()
    if output_dir is not None:
        return Path(output_dir) / name
    return Path(tempfile.mkdtemp(prefix=f"scaffold-{name}-logs-"))

