"""Anthropic's Messages API (``POST /v1/messages``): a request read into a :class:`~scaffold_serve.wire.ChatRequest`,
the generated choice written back as a message or as its stream of events.

``system`` (a text or text blocks) and ``messages`` whose content is a text or
blocks (``text``, ``tool_use`` on the assistant's side, ``tool_result`` on the
user's) become the same chat messages a chat-completions call has: the same session,
prefix invariant and recording. ``tools`` (``name``, ``description``,
``input_schema``), ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``; ``any`` and
``tool`` enforced by grammar-constrained decoding), ``stop_sequences`` (cut from the
text, ``stop_reason: stop_sequence``), ``temperature``, ``top_p``, ``top_k``,
``max_tokens`` and ``stream``. Errors have Anthropic's shape: ``{"type": "error",
"error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

from .responses import dumps
from .session import Choice
from .wire import (
    MAX_STOP,
    ChatRequest,
    Message,
    ToolCallSpec,
    WireError,
    _bool,
    _int,
    _number,
    bad,
    check_tool_choice,
    parse_content,
    parse_model,
    parse_tools,
)

#: Anthropic's error ``type`` for each status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 499: "invalid_request_error", 500: "api_error", 503: "overloaded_error",
               504: "api_error"}


def error_body(error: WireError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def parse_messages_request(body: Any) -> ChatRequest:
    """Check a ``/v1/messages`` body into the chat request it stands for (400s name the field)."""
    model = parse_model(body)
    max_tokens = _int(body, "max_tokens", 1)
    if max_tokens is None:
        raise bad("max_tokens", "is required (the most tokens to generate)")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        raise bad("thinking", "extended thinking is not served; leave it out (or {\"type\": \"disabled\"})")
    messages: list[Message] = []
    system = body.get("system")
    if system is not None:
        text = system if isinstance(system, str) else parse_content(_texts(system, "system"), "system")
        if text:
            messages.append(Message("system", text))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", f"must be a non-empty list of messages, got {type(raw).__name__}")
    for i, message in enumerate(raw):
        messages += _message(message, f"messages[{i}]")
    tools = _tools(body.get("tools"))
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOP * 4:
        raise bad("stop_sequences", f"must be a list of strings, got {stops!r}")
    top_k = _int(body, "top_k", 1)
    request = ChatRequest(
        model=model, messages=messages, tools=tools, tool_choice=_tool_choice(body.get("tool_choice")),
        max_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, 1.0),
        top_p=_number(body, "top_p", 0.0, 1.0, low_open=True), top_k=top_k, stop=tuple(s for s in stops if s),
        stream=_bool(body, "stream"))
    check_tool_choice(request)
    return request


def _texts(value: Any, where: str) -> Any:
    if not isinstance(value, list):
        raise bad(where, f"must be a string or a list of text blocks, got {type(value).__name__}")
    return [{"type": "text", "text": b.get("text")} if isinstance(b, dict) and b.get("type") == "text" else b
            for b in value]


def _message(value: Any, where: str) -> list[Message]:
    """One Anthropic message as chat messages: an assistant turn (text and calls), or a user turn whose
    ``tool_result`` blocks become ``tool`` messages before its text."""
    if not isinstance(value, dict) or value.get("role") not in ("user", "assistant", "system"):
        raise bad(f"{where}.role", "must be user, assistant or system")
    role, content = value["role"], value.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
    if role == "system":  # a system message between the turns (Claude Code sends them): text blocks
        return [Message("system", parse_content(_texts(content, f"{where}.content"), f"{where}.content"))]
    if not isinstance(content, list):
        raise bad(f"{where}.content", f"must be a string or a list of content blocks, got {type(content).__name__}")
    texts: list[str] = []
    calls: list[ToolCallSpec] = []
    results: list[Message] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise bad(f"{at}.text", "must be a string")
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                raise bad(at, "a tool_use block needs its id and name")
            calls.append(ToolCallSpec(block["name"], block.get("input", {}), block["id"]))
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad(f"{at}.tool_use_id", "must say which tool_use this result answers")
            result = block.get("content", "")
            text = result if isinstance(result, str) else parse_content(_texts(result, f"{at}.content"), at)
            results.append(Message("tool", text, tool_call_id=block["tool_use_id"]))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # no reasoning blocks are produced here; a client's are not part of the prompt
        else:
            raise bad(f"{at}.type", f"{kind!r} blocks are not served in {role} messages (text, tool_use, tool_result)")
    if role == "assistant":
        return [Message("assistant", "".join(texts), tool_calls=calls)]
    return [*results, *([Message("user", "".join(texts))] if texts or not results else [])]


def _tools(value: Any) -> list[dict[str, Any]]:
    """Anthropic's client tools (``name``, ``description``, ``input_schema``), checked as the chat shape's."""
    if not isinstance(value, list):
        return parse_tools(value)
    for i, tool in enumerate(value):
        if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):
            raise bad(f"tools[{i}].type", f"only client tools are served (the model runs here, with no server "
                                          f"tools), got {tool.get('type')!r}")
    return parse_tools([{"type": "function", "function": {
        "name": tool.get("name"), "description": tool.get("description"),
        "parameters": tool.get("input_schema", {"type": "object", "properties": {}})}}
        if isinstance(tool, dict) else tool for tool in value])


def _tool_choice(value: Any) -> Any:
    if value is None:
        return "auto"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value.get("name"), str):
        return {"name": value["name"]}
    raise bad("tool_choice", f"must be {{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}}, got {value!r}")


# -- the reply -------------------------------------------------------------------------------------


def new_id(prefix: str = "msg") -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def stop_reason(choice: Choice) -> str:
    if choice.tool_calls:
        return "tool_use"
    if choice.stop_sequence is not None:
        return "stop_sequence"
    return "max_tokens" if choice.finish_reason == "length" else "end_turn"


def blocks(choice: Choice) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "text", "text": choice.content}] if choice.content else []
    for call in choice.tool_calls:
        arguments = call.arguments if isinstance(call.arguments, dict) else {"value": call.arguments}
        out.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return out


def message(mid: str, model: str, choice: Choice, prompt_tokens: int) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks(choice),
            "stop_reason": stop_reason(choice), "stop_sequence": choice.stop_sequence,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": len(choice.result.output_ids)}}


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **data}) + b"\n\n"


def opening(mid: str, model: str, prompt_tokens: int) -> bytes:
    start: dict[str, Any] = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                             "stop_reason": None, "stop_sequence": None,
                             "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
    return event("message_start", {"message": start}) + event("ping", {})


class BlockStream:
    """A message's content blocks as events: text streamed as it is sampled opens block 0 on its first piece
    (:meth:`text`); :meth:`finish` completes it, sends the other blocks, the stop reason and the end."""

    def __init__(self) -> None:
        self.open = False

    def text(self, piece: str) -> bytes:
        out = b""
        if not self.open:
            self.open = True
            out = event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        return out + event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})

    def finish(self, choice: Choice, rest: str | None = None) -> Iterator[bytes]:
        """``rest``: the text left to send when pieces of it were streamed (None: send it whole)."""
        for index, block in enumerate(blocks(choice)):
            if block["type"] == "text":
                if not self.open:
                    yield self.text(block["text"])
                elif rest:
                    yield self.text(rest)
            else:
                yield event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
                yield event("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
            yield event("content_block_stop", {"index": index})
        yield event("message_delta", {"delta": {"stop_reason": stop_reason(choice),
                                                "stop_sequence": choice.stop_sequence},
                                      "usage": {"output_tokens": len(choice.result.output_ids)}})
        yield event("message_stop", {})


def error_event(error: WireError) -> bytes:
    return event("error", {"error": error_body(error)["error"]})
