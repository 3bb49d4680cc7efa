"""OpenAI's chat-completions wire format: a request body checked into a :class:`ChatRequest`, and errors.

Every check names the field (OpenAI's ``param``, e.g. ``messages[2].content``), the
value it got and what is allowed, and becomes a 400 with OpenAI's error body. Fields
this server does not know are ignored, as SDKs send many (``store``, ``metadata``,
``parallel_tool_calls``, ...); known fields of the wrong type, and sampling options no
scaffold engine honours (``frequency_penalty``, ``logit_bias``, ...) set to anything
but their neutral value, are refused rather than silently dropped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

#: Roles a message may have. ``developer`` is OpenAI's newer name for ``system``.
ROLES = ("system", "developer", "user", "assistant", "tool")
#: Most choices one request may ask for (``n``).
MAX_N = 16
#: Most stop strings one request may give (OpenAI's limit).
MAX_STOP = 4
#: Sampling options no engine here honours, with the value that means "off".
UNSUPPORTED_NEUTRAL: dict[str, Any] = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {},
                                       "functions": [], "function_call": "none", "audio": None,
                                       "prediction": None}
#: What a request's ``tool_choice`` is once checked: ``auto``, ``none``, ``required``, or ``{"name": <function>}``.
TOOL_CHOICES = ("auto", "none", "required")


class WireError(Exception):
    """An error answered with OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str | None = None) -> WireError:
    """A 400 naming ``param``."""
    return WireError(400, f"{param}: {message}", param=param, code=code)


@dataclass(slots=True)
class ToolCallSpec:
    """One tool call of an assistant message: the function's name, its arguments (parsed JSON when they are)."""

    name: str
    arguments: Any
    id: str = ""


@dataclass(slots=True)
class Message:
    """A chat message as a client sent it, checked.

    ``content`` is text (a list of text parts is joined; ``None`` is ``""``);
    ``tool_calls`` are an assistant's calls; ``tool_call_id`` says which call a
    ``tool`` message answers. :meth:`key` is what two messages must share to be
    the same message when a later request repeats the history.
    """

    role: str
    content: str
    name: str | None = None
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    tool_call_id: str | None = None

    def key(self) -> tuple[Any, ...]:
        calls = tuple((c.name, canonical_json(c.arguments)) for c in self.tool_calls)
        return (self.role, self.content.strip(), calls)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [wire_tool_call(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def canonical_json(value: Any) -> str:
    """One text per JSON value (sorted keys, no spaces): arguments compare equal however a client spaced them."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def wire_tool_call(call: ToolCallSpec) -> dict[str, Any]:
    """A tool call as OpenAI writes it: arguments as a JSON text."""
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


@dataclass(slots=True)
class ChatRequest:
    """A checked ``POST /v1/chat/completions`` body. ``None`` means "not given" (the server's default applies)."""

    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    #: ``None`` (free text), ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": {...}}``.
    response_format: dict[str, Any] | None = None

    @property
    def forced_tool(self) -> bool:
        """Whether the model must call a tool (``tool_choice`` ``required`` or a named function)."""
        return bool(self.tools) and (self.tool_choice == "required" or isinstance(self.tool_choice, dict))

    def tools_key(self) -> str:
        """The tools as one text: a later turn extends a conversation only under the same tools."""
        return canonical_json(self.tools) if self.tools else ""


# -- checking -------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _int(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        raise bad(key, f"must be {allowed}, got {value!r}")
    return value


def _number(body: dict[str, Any], key: str, low: float, high: float, *, low_open: bool = False) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_number(value) or value > high or value < low or (low_open and value == low):
        interval = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise bad(key, f"must be a number in {interval}, got {value!r}")
    return float(value)


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(key, f"must be true or false, got {value!r}")
    return value


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a decoded JSON body; raise :class:`WireError` (400, naming the field) on anything wrong."""
    model = parse_model(body)
    _refuse_unsupported(body)
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    top_logprobs = _int(body, "top_logprobs", 0, 20) or 0
    if top_logprobs and not _bool(body, "logprobs"):
        raise bad("top_logprobs", "needs logprobs: true (the most likely tokens come with each sampled token's "
                                  "logprob)")
    request = ChatRequest(
        model=model, messages=parse_messages(body.get("messages")), tools=parse_tools(body.get("tools")),
        tool_choice=parse_tool_choice(body.get("tool_choice")), max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0, low_open=True),
        top_k=_top_k(body), n=_int(body, "n", 1, MAX_N) or 1, stop=parse_stop(body.get("stop")),
        seed=_seed(body), logprobs=_bool(body, "logprobs"), top_logprobs=top_logprobs,
        stream=_bool(body, "stream"), include_usage=_include_usage(body),
        response_format=parse_response_format(body.get("response_format")),
    )
    check_tool_choice(request)
    return request


def parse_model(body: Any) -> str:
    """The ``model`` of a request body (which must be a JSON object), every dialect alike."""
    if not isinstance(body, dict):
        raise WireError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", f"must be the served model's name (a string; see GET /v1/models), got {model!r}")
    return model


def check_tool_choice(request: ChatRequest) -> None:
    """A forced or named tool choice needs the tools it names."""
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return
    if not request.tools:
        raise bad("tool_choice", f"is {choice!r}, but the request has no tools")
    if isinstance(choice, dict):
        names = [t["function"]["name"] for t in request.tools]
        if choice["name"] not in names:
            raise bad("tool_choice", f"names the function {choice['name']!r}, which is not among the request's tools "
                                     f"({', '.join(names)})")


def parse_response_format(value: Any, param: str = "response_format") -> dict[str, Any] | None:
    """``{"type": "text"}`` (or nothing): free text; ``json_object``; ``json_schema`` with ``json_schema.schema``
    (chat completions) or ``schema`` (the Responses API's ``text.format``)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise bad(param, f"must be {{\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}}, got {value!r}")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    spec = value.get("json_schema", value)
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad(f"{param}.json_schema.schema", f"must be a JSON Schema object, got {schema!r}")
    return {"type": "json_schema", "schema": schema, "name": spec.get("name")}


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for key, neutral in UNSUPPORTED_NEUTRAL.items():
        value = body.get(key)
        if value is not None and value != neutral:
            raise bad(key, f"is not supported by scaffold's engines (got {value!r}); leave it out")


def _top_k(body: dict[str, Any]) -> int | None:
    value = body.get("top_k")
    if value is None:
        return None
    if not _is_int(value) or (value != -1 and value < 1):
        raise bad("top_k", f"must be -1 (the whole vocabulary) or an integer >= 1, got {value!r}")
    return value


def _seed(body: dict[str, Any]) -> int | None:
    value = body.get("seed")
    if value is None:
        return None
    if not _is_int(value) or abs(value) >= 2**63:
        raise bad("seed", f"must be an integer (64-bit), got {value!r}")
    return value


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad("stream_options", f"must be an object such as {{\"include_usage\": true}}, got {options!r}")
    value = options.get("include_usage", False)
    if not isinstance(value, bool):
        raise bad("stream_options.include_usage", f"must be true or false, got {value!r}")
    return value


def parse_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", f"must be a string or a list of strings, got {value!r}")
    if len(stops) > MAX_STOP:
        raise bad("stop", f"at most {MAX_STOP} stop strings, got {len(stops)}")
    return tuple(s for s in stops if s)


def parse_tool_choice(value: Any, param: str = "tool_choice") -> Any:
    """``auto``, ``none``, ``required``, or a named function (``{"type": "function", "function": {"name": ...}}``,
    or the Responses API's ``{"type": "function", "name": ...}``) as ``{"name": ...}``."""
    if value is None:
        return "auto"
    if value in TOOL_CHOICES:
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        fn: Any = value.get("function") if isinstance(value.get("function"), dict) else value
        if isinstance(fn.get("name"), str) and fn["name"]:
            return {"name": fn["name"]}
    raise bad(param, "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                     f"{{\"name\": ...}}}}, got {value!r}")


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """Function tools as OpenAI specs ``{"type": "function", "function": {name, description, parameters}}``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad("tools", f"must be a list of tools, got {type(value).__name__}")
    tools = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad(where, "must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"{where}.function.name", "must be the function's name (a non-empty string)")
        description = fn.get("description", "")
        if description is not None and not isinstance(description, str):
            raise bad(f"{where}.function.description", f"must be a string, got {description!r}")
        parameters = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise bad(f"{where}.function.parameters", "must be a JSON Schema object")
        tools.append({"type": "function", "function": {"name": fn["name"], "description": description or "",
                                                       "parameters": parameters}})
    return tools


def parse_messages(value: Any) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise bad("messages", f"must be a non-empty list of messages, got {type(value).__name__}")
    return [parse_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def parse_message(value: Any, where: str) -> Message:
    if not isinstance(value, dict):
        raise bad(where, f"must be an object with a role and content, got {type(value).__name__}")
    role = value.get("role")
    if role not in ROLES:
        raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    name = value.get("name")
    if name is not None and not isinstance(name, str):
        raise bad(f"{where}.name", f"must be a string, got {name!r}")
    message = Message(role=role, content=parse_content(value.get("content"), f"{where}.content"), name=name)
    if role == "assistant":
        message.tool_calls = _tool_calls(value.get("tool_calls"), f"{where}.tool_calls")
    elif value.get("tool_calls") not in (None, []):
        raise bad(f"{where}.tool_calls", f"only assistant messages carry tool calls, not {role} messages")
    if role == "tool":
        call_id = value.get("tool_call_id")
        if not isinstance(call_id, str):
            raise bad(f"{where}.tool_call_id", f"a tool message must say which call it answers, got {call_id!r}")
        message.tool_call_id = call_id
    return message


def parse_content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(where, f"must be a string or a list of text parts, got {type(value).__name__}")
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad(f"{where}[{j}]", f"only text parts are supported, got {kind!r}")
        text = part.get("text")
        if not isinstance(text, str):
            raise bad(f"{where}[{j}].text", f"must be a string, got {text!r}")
        texts.append(text)
    return "".join(texts)


def _tool_calls(value: Any, where: str) -> list[ToolCallSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad(where, f"must be a list of tool calls, got {type(value).__name__}")
    calls = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}[{j}].function", "must be {\"name\": ..., \"arguments\": \"<JSON text>\"}")
        raw = fn.get("arguments", "{}")
        if isinstance(raw, str):
            try:
                arguments: Any = json.loads(raw) if raw.strip() else {}
            except (ValueError, RecursionError):
                arguments = raw  # kept as written: the model may have written invalid JSON
        elif isinstance(raw, dict):
            arguments = raw
        else:
            raise bad(f"{where}[{j}].function.arguments", f"must be a JSON text, got {type(raw).__name__}")
        call_id = call.get("id")
        calls.append(ToolCallSpec(fn["name"], arguments, call_id if isinstance(call_id, str) else ""))
    return calls
