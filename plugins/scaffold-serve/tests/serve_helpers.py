"""Shared helpers of the scaffold-serve tests: a live endpoint on a background loop, scripted tool-calling replies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from scaffold_core.sampling import SamplingParams
from scaffold_core.testing import BackgroundLoop, ScriptedEngine
from scaffold_multiturn.tool_formats import HermesFormat
from scaffold_serve.app import Endpoint, build_app
from scaffold_serve.backends import EngineBackend
from scaffold_serve.server import BackgroundServer
from scaffold_serve.service import ChatService, ServeOptions

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def last_message(prompt: str) -> str:
    """The text of the last message of a ByteTokenizer chat prompt (before the assistant header)."""
    body = prompt[: prompt.rfind("<|assistant|>")]
    return body[body.rfind("<|", 0, len(body) - len("<|end|>\n")):]


def scripted_reply(prompt: str, request: Any) -> str:
    """Calls ``add`` when asked to add; answers with the tool's result once it is back; else greets."""
    last = last_message(prompt)
    if "<tool_response>" in last:
        value = last.split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
        return f"The answer is {value}."
    if "Add 2 and 3" in last:
        return 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    if "HANG" in last:
        raise AssertionError("unreachable: the engine hangs on HANG before replying")
    return "Hello there."


class TrackingEngine(ScriptedEngine):
    """A scripted engine that hangs on prompts saying HANG and counts the generations cancelled."""

    def __init__(self, **kwargs: Any):
        super().__init__(scripted_reply, hang=lambda prompt: "HANG" in last_message(prompt), **kwargs)
        self.cancelled = 0

    async def generate(self, request):
        try:
            return await super().generate(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class LiveServer:
    """An endpoint over ``engine`` on a background event loop (started engine, bound loopback port)."""

    def __init__(self, engine: Any, *, loop: BackgroundLoop | None = None, api_key: str | None = None,
                 host: str = "127.0.0.1", tool_format: Any = None, options: ServeOptions | None = None,
                 start_engine: bool = True):
        self.own_loop = loop is None
        self.loop = loop or BackgroundLoop("scaffold-serve-test")
        self.engine = engine
        self.api_key = api_key
        self.options = options or ServeOptions(sampling=SamplingParams(max_tokens=256),
                                               context_length=getattr(engine, "context_length", None))
        self.format = tool_format or HermesFormat()
        self.start_engine = start_engine
        self.service: ChatService | None = None
        self.server: BackgroundServer | None = None
        self.loop.run(self._start(host), 120)

    async def _start(self, host: str) -> None:
        if self.start_engine:
            await self.engine.start()
        if self.options.context_length is None:
            self.options.context_length = getattr(self.engine, "context_length", None)
        self.service = ChatService(self.options, tokenizer=self.engine.tokenizer, tool_format=self.format,
                                   backend=EngineBackend(self.engine, timeout=600.0, seed=0))
        self.records: list[Any] = []

        async def on_finish(session: Any) -> dict[str, Any]:
            self.records.append(session)
            return session.summary()

        app = build_app(Endpoint(self.service, allow_open=True, on_finish=on_finish), api_key=self.api_key)
        self.server = await BackgroundServer(app, host=host).start()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def open_session(self) -> str:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        reply = httpx.post(f"{self.url}/sessions", headers=headers, timeout=10)
        reply.raise_for_status()
        return reply.json()["id"]

    def session(self, session_id: str) -> Any:
        assert self.service is not None
        return self.service.sessions[session_id].session

    def client(self, session_id: str | None = None, **kwargs: Any) -> Any:
        import openai

        base = f"{self.url}/sessions/{session_id}/v1" if session_id else f"{self.url}/v1"
        return openai.OpenAI(base_url=base, api_key=self.api_key or "none", max_retries=0, timeout=600, **kwargs)

    def async_client(self, session_id: str | None = None) -> Any:
        import openai

        base = f"{self.url}/sessions/{session_id}/v1" if session_id else f"{self.url}/v1"
        return openai.AsyncOpenAI(base_url=base, api_key=self.api_key or "none", max_retries=0, timeout=600)

    def close(self) -> None:
        try:
            if self.server is not None:
                self.loop.run(self.server.stop(), 30)
            if self.start_engine:
                self.loop.run(self.engine.close(), 30)
        finally:
            if self.own_loop:
                self.loop.close()


def tool_result(call: Any) -> str:
    """Run ``add`` for a tool call (an OpenAI SDK object or a dict)."""
    fn = call.function if hasattr(call, "function") else call["function"]
    args = json.loads(fn.arguments if hasattr(fn, "arguments") else fn["arguments"])
    return str(int(args["a"]) + int(args["b"]))


def model_turns_kept(trajectory: Any) -> list[str]:
    """The text of each model turn of a trajectory (from its sampled ids)."""
    conv = trajectory.conv
    return [t.text for t in conv.turns]
