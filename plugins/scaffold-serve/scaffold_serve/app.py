"""The HTTP side: a Starlette app speaking OpenAI's wire format, with bearer auth, body limits and disconnects.

Routes (every error has its dialect's error body, never a traceback)::

    GET    /v1/models                          the served model
    POST   /v1/chat/completions                a call: OpenAI chat completions (in the session named by
                                               X-Scaffold-Session, else the default session)
    POST   /v1/responses                       a call: OpenAI's Responses API (openai_responses.py)
    POST   /v1/messages                        a call: Anthropic's Messages API (anthropic_messages.py)
    GET    /sessions/{id}/v1/models            the same, under a session's base URL
    POST   /sessions/{id}/v1/chat/completions  a call in session {id}; /responses and /messages likewise
    POST   /sessions                           open a session (scaffold serve): {"id"?, "reference"?, "metadata"?}
    GET    /sessions                           open sessions (summaries)
    GET    /sessions/{id}                      a session's record: calls, conversations (ids, masks, logprobs, versions)
    POST   /sessions/{id}/reward               {"reward": number} and/or {"answer": text}
    POST   /sessions/{id}/finish               score, write and close it (scaffold serve)
    DELETE /sessions/{id}                      drop it unwritten (scaffold serve)
    GET    /health                             {"status": "ok"}

A client that disconnects while its call generates cancels the generation. Other routes under ``/v1``
(``/v1/completions``, ``/v1/embeddings``...) answer a 404 that lists what is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from . import anthropic_messages, openai_responses, responses
from .service import ChatService, Entry, Prepared
from .session import Choice
from .streaming import TextStream
from .wire import ChatRequest, WireError, parse_chat_request

#: The header that names a session for clients that cannot change their base URL.
SESSION_HEADER = "x-scaffold-session"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(responses.dumps(body), status_code=status, media_type="application/json", headers=headers)


#: What a 404 under /v1 lists.
SERVED = ("POST /v1/chat/completions, POST /v1/responses, POST /v1/messages and GET /v1/models (under a session's "
          "base URL /sessions/{id}/v1 too)")


def is_messages(path: str) -> bool:
    """Whether ``path`` is Anthropic's dialect (its errors have Anthropic's shape)."""
    return path.rstrip("/").endswith("/v1/messages") or "/v1/messages/" in path


def error_response(error: WireError, path: str = "") -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    body = anthropic_messages.error_body(error) if is_messages(path) else error.body()
    return json_response(body, error.status, headers)


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


class Guard:
    """ASGI middleware: bearer auth (when a key is set) and a cap on request bodies, before any route runs."""

    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.expected = f"bearer {api_key}".encode() if api_key else None
        self.max_body = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope["headers"])
        if refusal is not None:
            return await error_response(refusal, scope.get("path", ""))(scope, receive, send)
        limit, seen = self.max_body, 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge()
            return message

        await self.app(scope, counted, send)

    def _refusal(self, headers: list[tuple[bytes, bytes]]) -> WireError | None:
        auth = [v for k, v in headers if k == b"authorization"]
        keys = [v for k, v in headers if k == b"x-api-key"]  # Anthropic's SDKs send the key here
        lengths = [v for k, v in headers if k == b"content-length"]
        if self.expected is not None:
            if len(auth) + len(keys) != 1:
                given = b""
            elif auth:
                scheme, _, token = auth[0].strip().partition(b" ")
                given = scheme.lower() + b" " + token.strip()
            else:
                given = b"bearer " + keys[0].strip()
            if not hmac.compare_digest(given, self.expected):
                return WireError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>' "
                                      "(or 'x-api-key: <key>')", code="invalid_api_key")
        if len(lengths) > 1:
            return WireError(400, "more than one Content-Length header")
        if lengths and (not lengths[0].strip().isdigit() or int(lengths[0]) > self.max_body):
            return WireError(413, f"the request body is larger than this server accepts ({self.max_body} bytes)",
                             code="request_too_large")
        return None


async def read_json(request: Request) -> Any:
    try:
        raw = await request.body()
    except BodyTooLarge:
        raise WireError(413, "the request body is larger than this server accepts", code="request_too_large") from None
    if not raw:
        raise WireError(400, "the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError(400, f"the request body is not valid JSON (UTF-8): {exc}") from None


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await ``work``; if the client disconnects first (or this wait is cancelled), cancel it.

    Raises :class:`ClientGone` when the client went away.
    """
    task = asyncio.ensure_future(work)
    await asyncio.sleep(0)  # work that needs no waiting (a canned engine) is done now: no watcher needed
    if task.done():
        return task.result()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()


class Endpoint:
    """The routes over one :class:`ChatService`; ``on_finish`` scores and writes a finished session (serve)."""

    def __init__(self, service: ChatService, *, allow_open: bool,
                 on_finish: Callable[[Any], Awaitable[dict[str, Any]]] | None = None):
        self.service = service
        self.allow_open = allow_open
        self.on_finish = on_finish

    def routes(self) -> list[Route]:
        return [  # the call routes first: they are matched for nearly every request
            Route("/sessions/{sid}/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/sessions/{sid}/v1/responses", self.responses_api, methods=["POST"]),
            Route("/v1/responses", self.responses_api, methods=["POST"]),
            Route("/sessions/{sid}/v1/messages", self.messages_api, methods=["POST"]),
            Route("/v1/messages", self.messages_api, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            Route("/sessions", self.open_session, methods=["POST"]),
            Route("/sessions", self.list_sessions, methods=["GET"]),
            Route("/sessions/{sid}", self.get_session, methods=["GET"]),
            Route("/sessions/{sid}", self.drop_session, methods=["DELETE"]),
            Route("/sessions/{sid}/reward", self.reward, methods=["POST"]),
            Route("/sessions/{sid}/finish", self.finish, methods=["POST"]),
            Route("/sessions/{sid}/v1/models", self.models, methods=["GET"]),
            Route("/sessions/{sid}/v1/models/{model:path}", self.model, methods=["GET"]),
        ]

    # -- models and health ------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.service.options.model_name, "object": "model", "created": self.service.created,
                "owned_by": "scaffold"}

    async def models(self, request: Request) -> Response:
        if "sid" in request.path_params:
            self.service.entry(request.path_params["sid"])
        return json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        self.service.check_model(request.path_params["model"])
        return json_response(self._model_card())

    # -- chat --------------------------------------------------------------------------------------
    def _entry(self, request: Request) -> Entry:
        sid = request.path_params.get("sid")
        if sid is None:
            sid = request.headers.get(SESSION_HEADER)
        if sid is not None:
            return self.service.entry(sid)
        return self.service.default_entry(str(request.base_url).rstrip("/"))

    def _prepare(self, request: Request, entry: Entry, chat: ChatRequest) -> Prepared:
        tag_header = self.service.options.tag_header
        return self.service.prepare(entry, chat, request.headers.get(tag_header) if tag_header else None)

    async def _generate(self, request: Request, prepared: Prepared) -> list[Choice] | None:
        """The call's choices, or None when the client went away (its generation cancelled)."""
        try:
            return await unless_disconnected(request, self.service.run(prepared))
        except ClientGone:
            return None

    async def _live(self, request: Request, prepared: Prepared) -> AsyncIterator[tuple[str, Any]]:
        """Generate a streamed call: ``("text", piece)`` as the engine samples its content (one choice, an engine
        that decodes incrementally: :class:`~scaffold_serve.streaming.TextStream` says what is safe to send),
        then ``("sent", the TextStream)`` and ``("done", choices)`` (``None``: the client went away); a WireError
        is raised."""
        chat = prepared.request
        text = TextStream(prepared.entry.session.tokenizer, prepared.sampling.stop,
                          bool(chat.tools) and chat.tool_choice != "none")
        queue: asyncio.Queue[int] = asyncio.Queue()
        if chat.n == 1:
            prepared.listener = queue.put_nowait
        work = asyncio.ensure_future(self._generate(request, prepared))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, work}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                piece = text.push(getter.result())
                while not queue.empty():
                    piece += text.push(queue.get_nowait())
                if piece:
                    yield "text", piece
            yield "sent", text
            yield "done", work.result()
        finally:
            if not work.done():
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work

    @staticmethod
    def _events(body: AsyncIterator[bytes]) -> StreamingResponse:
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def chat(self, request: Request) -> Response:
        entry = self._entry(request)
        chat = parse_chat_request(await read_json(request))
        prepared = self._prepare(request, entry, chat)
        cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
        if chat.stream:
            return self._events(self._stream(request, prepared, cid, created))
        choices = await self._generate(request, prepared)
        if choices is None:
            return Response(status_code=499)
        return json_response(self._completion(prepared, choices, cid, created))

    # -- OpenAI's Responses API --------------------------------------------------------------------
    async def responses_api(self, request: Request) -> Response:
        entry = self._entry(request)
        chat, echo = openai_responses.parse_responses_request(await read_json(request), entry.session.stored_response)
        if chat.n != 1:
            raise WireError(400, "a response has one output", param="n")
        prepared = self._prepare(request, entry, chat)
        rid, created = openai_responses.new_id("resp"), int(time.time())
        prompt_tokens = len(prepared.plan.prompt_ids)
        if chat.stream:
            return self._events(self._response_stream(request, prepared, rid, created, echo))
        choices = await self._generate(request, prepared)
        if choices is None:
            return Response(status_code=499)
        return json_response(self._response(prepared, choices[0], rid, created, echo, prompt_tokens))

    def _response(self, prepared: Prepared, choice: Choice, rid: str, created: int, echo: dict[str, Any],
                  prompt_tokens: int) -> dict[str, Any]:
        chat = prepared.request
        items = openai_responses.output_items(choice, tokenizer=prepared.entry.session.tokenizer,
                                              logprobs=chat.logprobs, top=chat.top_logprobs)
        if echo["store"]:
            prepared.entry.session.store_response(rid, openai_responses.stored_messages(chat, choice))
        return openai_responses.response_object(rid, created, chat.model, echo, items, choice, prompt_tokens)

    async def _response_stream(self, request: Request, prepared: Prepared, rid: str, created: int,
                               echo: dict[str, Any]) -> AsyncIterator[bytes]:
        events = openai_responses.EventStream()
        model = prepared.request.model
        for chunk in events.opening(openai_responses.response_object(rid, created, model, echo, [], None, 0,
                                                                     status="in_progress")):
            yield chunk
        sent: TextStream | None = None
        choices: list[Choice] | None = None
        try:
            async for kind, value in self._live(request, prepared):
                if kind == "text":
                    for chunk in events.text(value):
                        yield chunk
                elif kind == "sent":
                    sent = value
                else:
                    choices = value
        except WireError as error:
            yield events.failed(openai_responses.response_object(rid, created, model, echo, [], None, 0), error)
            return
        if choices is None:
            return
        final = self._response(prepared, choices[0], rid, created, echo, len(prepared.plan.prompt_ids))
        for chunk in events.items(final["output"], sent.rest(choices[0].content) if sent is not None else None):
            yield chunk
        yield events.closing(final)

    # -- Anthropic's Messages API ------------------------------------------------------------------
    async def messages_api(self, request: Request) -> Response:
        entry = self._entry(request)
        chat = anthropic_messages.parse_messages_request(await read_json(request))
        prepared = self._prepare(request, entry, chat)
        mid = anthropic_messages.new_id()
        if chat.stream:
            return self._events(self._messages_stream(request, prepared, mid))
        choices = await self._generate(request, prepared)
        if choices is None:
            return Response(status_code=499)
        return json_response(anthropic_messages.message(mid, chat.model, choices[0], len(prepared.plan.prompt_ids)))

    async def _messages_stream(self, request: Request, prepared: Prepared, mid: str) -> AsyncIterator[bytes]:
        yield anthropic_messages.opening(mid, prepared.request.model, len(prepared.plan.prompt_ids))
        streamed = anthropic_messages.BlockStream()
        sent: TextStream | None = None
        choices: list[Choice] | None = None
        try:
            async for kind, value in self._live(request, prepared):
                if kind == "text":
                    yield streamed.text(value)
                elif kind == "sent":
                    sent = value
                else:
                    choices = value
        except WireError as error:
            yield anthropic_messages.error_event(error)
            return
        if choices is None:
            return
        for chunk in streamed.finish(choices[0], sent.rest(choices[0].content) if sent is not None else None):
            yield chunk

    def _completion(self, prepared: Prepared, choices: list[Choice], cid: str, created: int) -> dict[str, Any]:
        return responses.completion(cid, created, prepared.request.model, choices, len(prepared.plan.prompt_ids),
                                    logprobs=prepared.request.logprobs, tokenizer=prepared.entry.session.tokenizer,
                                    top_logprobs=prepared.request.top_logprobs)

    async def _stream(self, request: Request, prepared: Prepared, cid: str, created: int) -> AsyncIterator[bytes]:
        chat, model = prepared.request, prepared.request.model
        yield responses.first_chunks(cid, created, model, chat.n)
        sent: TextStream | None = None
        choices: list[Choice] | None = None
        try:
            async for kind, value in self._live(request, prepared):
                if kind == "text":
                    yield responses.content_chunk(cid, created, model, 0, value)
                elif kind == "sent":
                    sent = value
                else:
                    choices = value
        except WireError as error:
            yield responses.error_event(error.body())
            return
        if choices is None:
            return
        for choice in choices:
            rest = sent.rest(choice.content) if sent is not None and chat.n == 1 else None
            for chunk in responses.choice_chunks(cid, created, model, choice, logprobs=chat.logprobs,
                                                 tokenizer=prepared.entry.session.tokenizer,
                                                 top_logprobs=chat.top_logprobs, rest=rest):
                yield chunk
        if chat.include_usage:
            yield responses.usage_chunk(cid, created, model, len(prepared.plan.prompt_ids), choices)
        yield responses.DONE

    # -- sessions ----------------------------------------------------------------------------------
    async def open_session(self, request: Request) -> Response:
        if not self.allow_open:
            raise WireError(403, "sessions here are opened by the openai_agent controller, one per episode",
                            code="forbidden")
        body = await read_json(request) if int(request.headers.get("content-length") or 0) else {}
        if not isinstance(body, dict):
            raise WireError(400, "the body must be a JSON object: {\"id\"?, \"reference\"?, \"metadata\"?}")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise WireError(400, "metadata must be an object", param="metadata")
        sid = body.get("id")
        if sid is not None and not isinstance(sid, str):
            raise WireError(400, "id must be a string", param="id")
        session = self.service.open_session(session_id=sid, reference=body.get("reference"), metadata=metadata)
        base = f"{str(request.base_url).rstrip('/')}/sessions/{session.id}/v1"
        return json_response({"id": session.id, "base_url": base}, 201)

    async def list_sessions(self, request: Request) -> Response:
        return json_response({"sessions": [e.session.summary() for e in self.service.sessions.values()]})

    async def get_session(self, request: Request) -> Response:
        return json_response(self.service.entry(request.path_params["sid"]).session.to_dict())

    async def reward(self, request: Request) -> Response:
        session = self.service.entry(request.path_params["sid"]).session
        self.service.set_outcome(session, await read_json(request))
        return json_response(session.summary())

    async def finish(self, request: Request) -> Response:
        if self.on_finish is None:
            raise WireError(403, "sessions here end with their episode", code="forbidden")
        sid = request.path_params["sid"]
        entry = self.service.entry(sid)
        if int(request.headers.get("content-length") or 0):
            self.service.set_outcome(entry.session, await read_json(request))
        if entry.session.in_flight:
            raise WireError(409, f"session {sid!r} has calls in flight; finish it when they are done",
                            code="session_busy")
        self.service.close_session(sid)
        return json_response(await self.on_finish(entry.session))

    async def drop_session(self, request: Request) -> Response:
        if not self.allow_open:
            raise WireError(403, "sessions here end with their episode", code="forbidden")
        sid = request.path_params["sid"]
        self.service.entry(sid)
        self.service.close_session(sid)
        return json_response({"id": sid, "dropped": True})


async def _wire_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WireError)
    return error_response(exc, request.url.path)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    path = request.url.path
    message = {404: "no such route", 405: "method not allowed on this route"}.get(exc.status_code, str(exc.detail))
    message = f"{message}: {request.method} {path[:200]}"
    if exc.status_code == 404 and "/v1/" in path:
        message += f"; this server serves {SERVED}"
    return error_response(WireError(exc.status_code, message, code="not_served" if exc.status_code == 404 else None),
                          path)


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(WireError(500, f"internal error: {type(exc).__name__}", type="server_error"),
                          request.url.path)


def build_app(endpoint: Endpoint, *, api_key: str | None = None) -> Any:
    """The ASGI app: the routes behind :class:`Guard`."""
    app = Starlette(routes=endpoint.routes(), exception_handlers={
        WireError: _wire_error, HTTPException: _http_error, Exception: _server_error})
    return Guard(app, api_key=api_key, max_body_bytes=endpoint.service.options.max_body_bytes)
