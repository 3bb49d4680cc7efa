"""``scaffold serve CONFIG``: the config's engine behind the OpenAI-compatible endpoint, until Ctrl-C.

The core's command line parses the arguments and hands them here (this plugin is
imported only when the command runs). Everything is checked before the model loads:
the config, and that a bind beyond loopback has an API key.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

#: The environment variable ``--api-key`` defaults to (keeps the key out of the process list).
API_KEY_ENV = "SCAFFOLD_API_KEY"


def serve(args: argparse.Namespace) -> int:
    from scaffold_core.config import apply_overrides, load_config, read_yaml
    from scaffold_core.output.rundir import expand_output_dir
    from scaffold_core.plugins import get_registry

    from .clients_task import NAME
    from .recording import build
    from .server import check_bind

    overrides = list(args.overrides or [])
    if not (apply_overrides(read_yaml(args.config), list(overrides)).get("task") or {}).get("name"):
        overrides.append(f"task.name={NAME}")  # only an engine: the prompts and rewards are the clients'
    config = load_config(args.config, overrides)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)
    components = build(config, get_registry())
    output = Path(args.output) if args.output else expand_output_dir(config)
    return asyncio.run(_serve(config, components, output, args.host, args.port, api_key))


async def _serve(config: Any, components: Any, output: Path, host: str, port: int, api_key: str | None) -> int:
    from scaffold_core.engine import RunInfo

    from .app import Endpoint, build_app
    from .backends import EngineBackend
    from .recording import Recorder
    from .server import BackgroundServer
    from .service import ChatService, ServeOptions

    recorder = Recorder(config, components, output)
    engine = components.engine
    if hasattr(engine, "attach_run"):
        engine.attach_run(RunInfo(output_dir=output))
    print(f"scaffold serve: loading engine {components.engine_name!r}", file=sys.stderr)
    await engine.start()
    server = service = None
    try:
        options = ServeOptions(model_name=components.model_name, sampling=config.sampling.params(),
                               context_length=engine.context_length)
        service = ChatService(options, tokenizer=engine.tokenizer, tool_format=components.tool_format,
                              backend=EngineBackend(engine, timeout=config.rollout.request_timeout,
                                                    name=components.engine_name, seed=config.sampling.seed))
        endpoint = Endpoint(service, allow_open=True, on_finish=recorder.finish)
        server = BackgroundServer(build_app(endpoint, api_key=api_key), host, port, log_level="info")
        await server.start()
        print(f"scaffold serve: {options.model_name!r} at {server.url}/v1 (chat completions, responses, messages); "
              f"calls there are recorded into session {options.default_session!r}, each session's own base URL is "
              f"{server.url}/sessions/<id>/v1 (POST {server.url}/sessions opens one); finished sessions go to "
              f"{recorder.path}; Ctrl-C stops", file=sys.stderr, flush=True)
        with _stop_on_signals(server):
            assert server.task is not None
            await server.task
    finally:
        if server is not None:
            await server.stop()
        await _write_open(service, recorder)
        recorder.close()
        await engine.close()
    return 0


class _stop_on_signals:
    """SIGINT/SIGTERM: stop taking requests, let those in flight finish; a second one stops at once."""

    def __init__(self, server: Any):
        self.server = server
        self.installed: list[int] = []

    def __enter__(self) -> _stop_on_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._handle)
                self.installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                pass
        return self

    def _handle(self) -> None:
        uvicorn_server = self.server.server
        if uvicorn_server is None:
            return
        if uvicorn_server.should_exit:
            uvicorn_server.force_exit = True
        uvicorn_server.should_exit = True
        print("\nscaffold serve: stopping (writing the open sessions)", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.installed:
            loop.remove_signal_handler(sig)


async def _write_open(service: Any, recorder: Any) -> None:
    """Sessions still open when the server stops are written as they are (nothing a client produced is lost)."""
    if service is None:
        return
    for session_id in list(service.sessions):
        session = service.close_session(session_id)
        if session is not None and session.trajectories:
            await recorder.finish(session)
    if recorder.written:
        print(f"scaffold serve: {recorder.written} session(s) in {recorder.path}", file=sys.stderr)
