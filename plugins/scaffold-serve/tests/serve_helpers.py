"""Shared helpers of the scaffold-serve tests: a live endpoint on a background loop, scripted tool-calling replies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

from scaffold_testkit import BackgroundLoop, ScriptedEngine

from scaffold_core.sampling import SamplingParams
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


def listed_tools(prompt: str) -> list[str]:
    """The tools the hermes format described in the prompt's system message."""
    found = re.search(r"<tools>\n(.*?)\n</tools>", prompt, re.S)
    return re.findall(r'"name": "([^"]+)"', found.group(1)) if found else []


def example_value(schema: Any) -> Any:
    """A small value valid against a simple JSON Schema (what a scripted model answers in a typed output)."""
    if not isinstance(schema, dict):
        return 5
    kind = schema.get("type")
    if "const" in schema:
        return schema["const"]
    if "anyOf" in schema:
        return example_value(schema["anyOf"][0])
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: example_value(v) for k, v in props.items() if k in (schema.get("required") or list(props))}
    if kind == "array":
        return [example_value(schema.get("items"))]
    return {"integer": 5, "number": 5, "boolean": True, "null": None}.get(kind, "The answer is 5.")


def call_text(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def forced_call(constraint: Any, last: str) -> str:
    """A call a forced tool choice allows: ``add`` when the task asks to add, else the first other tool, its
    arguments made from its schema (``answer``-like strings carry the observed result)."""
    spec = json.loads(constraint.spec)["format"]["elements"][1]["json_schema"]
    options = spec.get("anyOf", [spec])
    tools = {o["properties"]["name"]["const"]: o["properties"]["arguments"] for o in options}
    if "add" in tools and "Add 2 and 3" in last:
        return call_text("add", {"a": 2, "b": 3})
    name = next((n for n in tools if n != "add"), "add")
    return call_text(name, example_value(tools[name]))


def scripted_reply(prompt: str, request: Any) -> str:
    """A scripted model for real clients. It calls ``add`` when asked to add (or a sub-agent tool that can), answers
    with the tool's result once it is back, writes code for a code agent, obeys a forced tool choice or a JSON
    schema; else greets."""
    last = last_message(prompt)
    constraint = request.sampling.constraint
    observed = re.search(r"(?:<tool_response>\n|Observation:\n?)(.*?)(?:\n</tool_response>|<\|end\|>|$)", last, re.S)
    if constraint is not None and constraint.kind == "structural_tag":
        if observed:
            last = "The answer is 5."
        return forced_call(constraint, last)
    if constraint is not None:
        return json.dumps(example_value(json.loads(constraint.spec)))
    if observed:
        value = observed.group(1).strip()
        return value if value.startswith("The answer is") else f"The answer is {value}."
    if "HANG" in last:
        raise AssertionError("unreachable: the engine hangs on HANG before replying")
    if "Add 2 and 3" in last:
        if "<code>" in prompt and "final_answer" in prompt and not listed_tools(prompt):  # a code agent
            return ('Thought: add them.\n<code>\nresult = add(a=2, b=3)\nfinal_answer(f"The answer is {result}.")'
                    '\n</code>')
        tools = listed_tools(prompt)
        if "add" in tools or not tools:
            return 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        helper = tools[0]
        return f'Asking {helper}.\n{call_text(helper, {"input": "Add 2 and 3."})}'
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


@contextlib.contextmanager
def serving(engine: Any, **options: Any) -> Iterator[LiveServer]:
    """A :class:`LiveServer` over ``engine`` for the block's duration (a module fixture's body)."""
    server = LiveServer(engine, **options)
    try:
        yield server
    finally:
        server.close()


def smolagents_add_tool() -> Any:
    """``add`` as a smolagents tool (smolagents reads the arguments' descriptions from the docstring)."""
    import smolagents

    @smolagents.tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        return a + b

    return add
