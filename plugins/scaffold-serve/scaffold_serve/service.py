"""What the endpoint does, apart from HTTP: sessions, sampling, the context check, generating and recording.

:class:`ChatService` is shared by ``scaffold serve`` (sessions made by clients, generations
straight on the engine) and the ``openai_agent`` controller (sessions made per episode,
generations through the episode's runtime). The HTTP layer (:mod:`scaffold_serve.app`)
decodes, authenticates and streams; everything here is plain Python on the event loop.
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from scaffold_core.generation import GenerationResult
from scaffold_core.sampling import SamplingParams, mix_seed

from .constrain import check_engine, constraint_for
from .session import Choice, Plan, Session
from .wire import ChatRequest, WireError

#: What a session id may be: it appears in URLs and files, so nothing that could mean a path.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Characters per token of context a request's messages may have before anything is tokenized: far more
#: than any tokenizer packs into a token, so only prompts that could never fit are refused unread.
CHARS_PER_TOKEN = 64


@dataclass
class ServeOptions:
    """The endpoint's settings.

    ``sampling``: the defaults a request's own parameters override. ``sampling_from``:
    ``request`` (a server: the client's temperature, top_p, seed... win) or ``config``
    (training: the run's sampling decides temperature, top_p, top_k and seeds; a
    client's ``max_tokens`` can only lower the configured one, its ``stop`` strings
    are added). ``max_sessions``: open sessions at most; ``max_calls``: calls per
    session at most; ``max_in_flight``: concurrent calls per session at most.
    """

    model_name: str = "scaffold"
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=512))
    sampling_from: Literal["request", "config"] = "request"
    max_sessions: int = 4096
    max_calls: int = 4096
    max_in_flight: int = 64
    max_body_bytes: int = 16 << 20
    context_length: int | None = None
    tag_header: str | None = None
    #: Where calls that name no session go (``POST /v1/chat/completions``...): recorded into the session of this id,
    #: opened on the first such call (``scaffold serve``: ``default``); ``None``: refused with a 404 naming the
    #: session URL.
    default_session: str | None = "default"


#: The longest call tag kept (a header value is the client's to choose).
MAX_TAG = 128


@dataclass(eq=False)
class Entry:
    """A session, the backend its generations go to, the sampling defaults of its calls, and who decides
    their sampling (``config`` or ``request``; ``None``: the service's ``sampling_from``)."""

    session: Session
    backend: Any
    sampling: SamplingParams
    sampling_from: Literal["request", "config"] | None = None


@dataclass(slots=True)
class Prepared:
    """A checked call, ready to generate: the session's plan, sampling and a seed per choice."""

    entry: Entry
    request: ChatRequest
    plan: Plan
    sampling: SamplingParams
    seeds: list[int | None]
    request_id: str
    tag: str | None = None
    #: Called with each output id as the engine samples it (a streamed call), when the backend can.
    listener: Any = None


class ChatService:
    """Sessions and calls (see the module docstring). ``tool_format`` is the format object (hermes, native...)."""

    def __init__(self, options: ServeOptions, *, tokenizer: Any, tool_format: Any, backend: Any = None):
        self.options = options
        self.tokenizer = tokenizer
        self.format = tool_format
        self.backend = backend
        self.sessions: dict[str, Entry] = {}
        self.created = int(time.time())
        self._calls = itertools.count()

    # -- sessions ----------------------------------------------------------------------------------
    def open_session(self, backend: Any = None, *, session_id: str | None = None, reference: Any = None,
                     metadata: dict[str, Any] | None = None, tokenizer: Any = None,
                     sampling: SamplingParams | None = None,
                     sampling_from: Literal["request", "config"] | None = None) -> Session:
        """A new session; ``backend``, ``tokenizer``, ``sampling`` and ``sampling_from`` default to the service's."""
        if len(self.sessions) >= self.options.max_sessions:
            raise WireError(429, f"{len(self.sessions)} sessions are open, the most this server keeps "
                                 "(max_sessions); finish some first", code="too_many_sessions")
        if session_id is None:
            session_id = secrets.token_hex(8)
        elif not SESSION_ID.fullmatch(session_id):
            raise WireError(400, "a session id is 1 to 64 letters, digits, '_' or '-'", param="id")
        if session_id in self.sessions:
            raise WireError(409, f"session {session_id!r} already exists", param="id", code="session_exists")
        session = Session(session_id, tokenizer if tokenizer is not None else self.tokenizer, self.format,
                          reference=reference, metadata=metadata)
        self.sessions[session_id] = Entry(session, backend if backend is not None else self.backend,
                                          sampling or self.options.sampling, sampling_from)
        return session

    def default_entry(self, url: str) -> Entry:
        """The session calls that name none go to (opened on first use), or a 404 naming the session URL."""
        sid = self.options.default_session
        if sid is None or self.backend is None:
            raise WireError(404, f"calls here belong to a session: open one (POST {url}/sessions) and use its base URL "
                                 f"{url}/sessions/<id>/v1", code="session_not_found")
        if sid not in self.sessions:
            self.open_session(session_id=sid, metadata={"default": True})
        return self.sessions[sid]

    def entry(self, session_id: str) -> Entry:
        found = self.sessions.get(session_id) if SESSION_ID.fullmatch(session_id) else None
        if found is None:
            raise WireError(404, f"no open session {session_id[:80]!r} (open one with POST /sessions)",
                            type="invalid_request_error", code="session_not_found")
        return found

    def close_session(self, session_id: str) -> Session | None:
        entry = self.sessions.pop(session_id, None)
        if entry is None:
            return None
        entry.session.closed = True
        return entry.session

    # -- calls --------------------------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.options.model_name:
            raise WireError(404, f"the model {model[:100]!r} does not exist here; this server serves "
                                 f"{self.options.model_name!r} (GET /v1/models)", param="model",
                            code="model_not_found")

    def prepare(self, entry: Entry, request: ChatRequest, tag: str | None = None) -> Prepared:
        """Check the call and plan it against its session (nothing recorded until it is generated); ``tag``
        (the value of the ``tag_header``, if any) is recorded with it."""
        self.check_model(request.model)
        self._check_size(request)
        session = entry.session
        if session.counts["calls"] >= self.options.max_calls:
            raise WireError(429, f"session {session.id!r} has made {session.counts['calls']} calls, the most one "
                                 "session may make (max_calls)", code="too_many_calls")
        if session.in_flight >= self.options.max_in_flight:
            raise WireError(429, f"session {session.id!r} has {session.in_flight} calls in flight, the most one "
                                 "session may have (max_in_flight)", code="too_many_calls")
        try:
            plan = session.plan(request)
        except WireError:
            raise
        except Exception as exc:  # a chat template or tool format that cannot render these messages
            raise WireError(400, f"the messages cannot be rendered with the model's chat template: "
                                 f"{type(exc).__name__}: {exc}", param="messages") from exc
        self._check_context(len(plan.prompt_ids), request.max_tokens)
        sampling_from = entry.sampling_from or self.options.sampling_from
        sampling = self.sampling(request, entry.sampling, sampling_from)
        constraint = constraint_for(request, self.format)
        if constraint is not None:
            check_engine(constraint, getattr(entry.backend, "engine", None), getattr(entry.backend, "name", "engine"))
            sampling = sampling.replace(constraint=constraint)
        call = next(self._calls)
        seeds: list[int | None] = [None] * request.n  # the backend's own (a fresh seed per call and choice)
        if request.seed is not None and sampling_from == "request":
            seeds = [mix_seed(request.seed, i) for i in range(request.n)]  # the same seed, the same choices
        return Prepared(entry, request, plan, sampling, seeds, f"{session.id}/{session.counts['calls']}/{call}",
                        tag[:MAX_TAG] if tag else None)

    def _check_size(self, request: ChatRequest) -> None:
        """Refuse, before rendering or tokenizing anything, messages no context could hold (rendering and
        tokenizing megabytes would hold the event loop)."""
        limit = self.options.context_length
        if limit is None:
            return
        chars = sum(len(m.content) for m in request.messages)
        if chars > limit * CHARS_PER_TOKEN:
            raise WireError(400, f"the messages have {chars} characters, more than this model's context of {limit} "
                                 "tokens can hold; shorten them", param="messages", code="context_length_exceeded")

    def _check_context(self, prompt_len: int, max_tokens: int | None) -> None:
        limit = self.options.context_length
        if limit is None:
            return
        if prompt_len >= limit or (max_tokens is not None and prompt_len + max_tokens > limit):
            asked = f" plus {max_tokens} to generate" if max_tokens is not None else ""
            raise WireError(400, f"this model's context is {limit} tokens, but the prompt has {prompt_len} tokens"
                                 f"{asked}; shorten the messages or lower max_tokens", param="messages",
                            code="context_length_exceeded")

    def sampling(self, request: ChatRequest, base: SamplingParams,
                 sampling_from: Literal["request", "config"] | None = None) -> SamplingParams:
        """The call's sampling: the request's parameters over ``base``, or ``base`` (see ``sampling_from``)."""
        if (sampling_from or self.options.sampling_from) == "config":
            max_tokens = min(request.max_tokens, base.max_tokens) if request.max_tokens else base.max_tokens
            return base.replace(max_tokens=max_tokens, stop=tuple(dict.fromkeys(base.stop + request.stop)),
                                top_logprobs=request.top_logprobs)
        return SamplingParams(
            max_tokens=request.max_tokens or base.max_tokens,
            temperature=base.temperature if request.temperature is None else request.temperature,
            top_p=base.top_p if request.top_p is None else request.top_p,
            top_k=base.top_k if request.top_k is None else request.top_k,
            stop=request.stop or base.stop, stop_token_ids=base.stop_token_ids,
            seed=base.seed if request.seed is None else request.seed, top_logprobs=request.top_logprobs)

    async def run(self, prepared: Prepared) -> list[Choice]:
        """Generate the call's choices and record them in the session."""
        entry = prepared.entry
        session = entry.session
        session.in_flight += 1
        try:
            results: list[GenerationResult] = await entry.backend.generate(
                prepared.request_id, prepared.plan.prompt_ids, prepared.sampling, prepared.seeds, session.id,
                listener=prepared.listener)
        finally:
            session.in_flight -= 1
        if session.closed:
            raise WireError(409, f"session {session.id!r} was closed while this call ran", code="session_closed")
        return session.commit(prepared.plan, results, prepared.request, prepared.tag, prepared.sampling.stop,
                              prepared.sampling.constraint)

    # -- rewards -------------------------------------------------------------------------------------
    @staticmethod
    def set_outcome(session: Session, body: Any) -> None:
        """``{"reward": number}`` and/or ``{"answer": text}`` (scored by the task's verifier when no reward is set)."""
        if not isinstance(body, dict) or not ({"reward", "answer"} & set(body)):
            raise WireError(400, "send {\"reward\": <number>} (or {\"answer\": \"<final answer>\"} for the task's "
                                 "verifier to score)", param="reward")
        reward = body.get("reward")
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward \
                    or reward in (float("inf"), float("-inf")):
                raise WireError(400, f"reward must be a finite number, got {reward!r}", param="reward")
            session.reward, session.reward_source = float(reward), "posted"
        answer = body.get("answer")
        if answer is not None:
            if not isinstance(answer, str):
                raise WireError(400, f"answer must be a string, got {type(answer).__name__}", param="answer")
            session.answer = answer
