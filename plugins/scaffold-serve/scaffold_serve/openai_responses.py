"""OpenAI's Responses API (``POST /v1/responses``): a request read into a :class:`~scaffold_serve.wire.ChatRequest`,
the generated choice written back as a response object or as its stream of events.

The request's ``input`` (a text, or items: messages, ``function_call`` and
``function_call_output`` items) after its ``instructions`` becomes the same chat
messages a chat-completions call has, so it runs in the same session, through the
same prefix invariant, onto the same recording. ``previous_response_id`` continues
a stored response: its input and output come first (responses are stored per
session unless ``store`` is false). ``include: ["message.output_text.logprobs"]``
(with ``top_logprobs``) returns each output token's logprob. ``text.format``
``json_schema``/``json_object`` and ``tool_choice`` ``required`` or a named function
are enforced by grammar-constrained decoding, as in chat completions. Function tools
(and the functions of a ``namespace``) are offered to the model; tools OpenAI hosts
(``web_search``...) are not, as nothing here runs them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

from .responses import logprobs_of, sse
from .session import Choice
from .wire import (
    ChatRequest,
    Message,
    ToolCallSpec,
    WireError,
    _bool,
    _int,
    _number,
    _refuse_unsupported,
    bad,
    check_tool_choice,
    parse_content,
    parse_model,
    parse_response_format,
    parse_tool_choice,
    parse_tools,
)

#: The ``include`` value that asks for output logprobs.
LOGPROBS = "message.output_text.logprobs"


def parse_responses_request(body: Any, stored: Any) -> tuple[ChatRequest, dict[str, Any]]:
    """Check a ``/v1/responses`` body: (the chat request it stands for, what the response echoes).

    ``stored(response_id)`` returns the messages of a stored response (its input and output), or raises a 404.
    """
    model = parse_model(body)
    _refuse_unsupported(body)
    messages: list[Message] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise bad("previous_response_id", f"must be a response id, got {previous!r}")
        messages += stored(previous)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", f"must be a string, got {type(instructions).__name__}")
    if instructions and not previous:
        messages.insert(0, Message("system", instructions))
    messages += parse_input(body.get("input"))
    if not messages:
        raise bad("input", "must hold at least one message")
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise bad("text", f"must be an object such as {{\"format\": {{\"type\": \"text\"}}}}, got {text!r}")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise bad("include", f"must be a list of strings, got {include!r}")
    top = _int(body, "top_logprobs", 0, 20) or 0
    tools = [t for t in body.get("tools") or []] if isinstance(body.get("tools"), list) else body.get("tools")
    request = ChatRequest(
        model=model, messages=messages, tools=parse_tools(_function_tools(tools)),
        tool_choice=parse_tool_choice(body.get("tool_choice")), max_tokens=_int(body, "max_output_tokens", 1),
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0, low_open=True),
        logprobs=LOGPROBS in include or top > 0, top_logprobs=top, stream=_bool(body, "stream"),
        response_format=parse_response_format((text or {}).get("format"), "text.format"),
    )
    check_tool_choice(request)
    store = body.get("store")
    echo = {"instructions": instructions, "previous_response_id": previous, "store": store is not False,
            "tools": tools or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "text": text or {"format": {"type": "text"}},
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {},
            "top_logprobs": top}
    return request, echo


#: Tools the Responses API runs on OpenAI's side. The model served here has none of them, so they are not offered to
#: it (never described in its prompt); a harness that lists them by default (Codex lists web_search) still works.
HOSTED_TOOLS = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                          "computer_use_preview", "mcp", "local_shell", "tool_search"})


def _function_tools(tools: Any) -> Any:
    """The Responses API's flat function tools (``{"type": "function", "name", "parameters"}``) in the chat shape;
    a ``namespace``'s functions are offered by their own names; hosted tools are left out (:data:`HOSTED_TOOLS`)."""
    if not isinstance(tools, list):
        return tools
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind == "namespace" and isinstance(tool.get("tools"), list):
            out += _function_tools(tool["tools"])
        elif kind in HOSTED_TOOLS:
            continue
        elif kind == "function":
            out.append({"type": "function", "function": {k: tool.get(k) for k in ("name", "description", "parameters")
                                                          if tool.get(k) is not None}})
        else:
            raise bad(f"tools[{i}]", f"only function tools are served (and namespaces of them; hosted tools are not "
                                     f"offered to the model), got {kind!r}")
    return out


def parse_input(value: Any) -> list[Message]:
    """``input``: a text (one user message) or a list of items."""
    if value is None:
        return []
    if isinstance(value, str):
        return [Message("user", value)]
    if not isinstance(value, list):
        raise bad("input", f"must be a string or a list of items, got {type(value).__name__}")
    messages: list[Message] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(where, f"must be an item object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"{where}.role", f"must be user, system, developer or assistant, got {role!r}")
            content = parse_content(item.get("content"), f"{where}.content")
            if role == "assistant" and messages and messages[-1].role == "assistant" and not messages[-1].content \
                    and not messages[-1].tool_calls:
                messages[-1].content = content
            else:
                messages.append(Message(role, content))
        elif kind == "function_call":
            call = _function_call(item, where)
            if messages and messages[-1].role == "assistant":  # another part of the same model turn
                messages[-1].tool_calls.append(call)
            else:
                messages.append(Message("assistant", "", tool_calls=[call]))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad(f"{where}.call_id", f"must say which call this output answers, got {call_id!r}")
            output = item.get("output")
            text = output if isinstance(output, str) else parse_content(output, f"{where}.output")
            messages.append(Message("tool", text, tool_call_id=call_id))
        elif kind == "reasoning":
            continue  # the model here writes no separate reasoning items; a client's are not part of the prompt
        else:
            raise bad(f"{where}.type", f"items of type {kind!r} are not served (message, function_call, "
                                       "function_call_output)")
    return messages


def _function_call(item: dict[str, Any], where: str) -> ToolCallSpec:
    name, call_id, raw = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise bad(f"{where}.name", f"must be the function's name, got {name!r}")
    if not isinstance(call_id, str):
        raise bad(f"{where}.call_id", f"must be the call's id, got {call_id!r}")
    if not isinstance(raw, str):
        raise bad(f"{where}.arguments", f"must be a JSON text, got {type(raw).__name__}")
    try:
        arguments: Any = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        arguments = raw
    return ToolCallSpec(name, arguments, call_id)


# -- the response ------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def output_items(choice: Choice, *, tokenizer: Any, logprobs: bool, top: int) -> list[dict[str, Any]]:
    """The choice as output items: its text as a message (if any), then one ``function_call`` per call."""
    items: list[dict[str, Any]] = []
    if choice.content:
        part: dict[str, Any] = {"type": "output_text", "text": choice.content, "annotations": []}
        if logprobs:
            part["logprobs"] = [_logprob(t) for t in logprobs_of(tokenizer, choice, top)["content"]]
        items.append({"type": "message", "id": new_id("msg"), "status": "completed", "role": "assistant",
                      "content": [part]})
    for call in choice.tool_calls:
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments,
                                                                                       ensure_ascii=False)
        items.append({"type": "function_call", "id": new_id("fc"), "call_id": call.id, "name": call.name,
                      "arguments": arguments, "status": "completed"})
    return items


def _logprob(token: dict[str, Any]) -> dict[str, Any]:
    return {"token": token["token"], "logprob": token["logprob"], "bytes": token["bytes"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                             for t in token["top_logprobs"]]}


def response_object(rid: str, created: int, model: str, echo: dict[str, Any], items: list[dict[str, Any]],
                    choice: Choice | None, prompt_tokens: int, status: str = "completed") -> dict[str, Any]:
    output_tokens = len(choice.result.output_ids) if choice is not None else 0
    incomplete = choice is not None and choice.finish_reason == "length"
    if status == "completed" and incomplete:
        status = "incomplete"
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
        "output": items, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "usage": {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": prompt_tokens + output_tokens} if choice is not None else None,
        "reasoning": None, "truncation": "disabled", "user": None, **echo,
    }


def stored_messages(request: ChatRequest, choice: Choice) -> list[Message]:
    """What a later ``previous_response_id`` continues: the request's messages and the model's reply."""
    reply = Message("assistant", choice.content or "", tool_calls=list(choice.tool_calls))
    return [*request.messages, reply]


class EventStream:
    """The stream of one response's server-sent events, numbered. Text streamed as it is sampled goes into a
    message item opened on its first piece (:meth:`text`); :meth:`items` then completes it and sends the rest."""

    def __init__(self) -> None:
        self.sequence = 0
        self.message_id: str | None = None

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\n" + sse(payload)

    def opening(self, response: dict[str, Any]) -> Iterator[bytes]:
        yield self.event("response.created", response=response)
        yield self.event("response.in_progress", response=response)

    def _open_message(self, item_id: str) -> Iterator[bytes]:
        self.message_id = item_id
        yield self.event("response.output_item.added", output_index=0, item={
            "type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []})
        yield self.event("response.content_part.added", output_index=0, item_id=item_id, content_index=0,
                         part={"type": "output_text", "text": "", "annotations": []})

    def text(self, piece: str) -> Iterator[bytes]:
        """A piece of the message's text, as it is sampled."""
        if self.message_id is None:
            yield from self._open_message(new_id("msg"))
        yield self.event("response.output_text.delta", output_index=0, item_id=self.message_id, content_index=0,
                         delta=piece, logprobs=[])

    def items(self, items: list[dict[str, Any]], rest: str | None = None) -> Iterator[bytes]:
        """Each output item: added, its content (what is left of the text, or the call's arguments), done.
        ``rest``: the text left to send when pieces of it were streamed (None: send it whole)."""
        for index, item in enumerate(items):
            if item["type"] == "message":
                part = item["content"][0]
                if self.message_id is None:
                    yield from self._open_message(item["id"])
                    rest = None
                item["id"] = self.message_id
                delta = part["text"] if rest is None else rest
                if delta or part.get("logprobs"):
                    yield self.event("response.output_text.delta", output_index=index, item_id=item["id"],
                                     content_index=0, delta=delta, logprobs=part.get("logprobs", []))
                yield self.event("response.output_text.done", output_index=index, item_id=item["id"],
                                 content_index=0, text=part["text"], logprobs=part.get("logprobs", []))
                yield self.event("response.content_part.done", output_index=index, item_id=item["id"],
                                 content_index=0, part=part)
            else:
                yield self.event("response.output_item.added", output_index=index,
                                 item={**item, "arguments": "", "status": "in_progress"})
                yield self.event("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                                 delta=item["arguments"])
                yield self.event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                                 arguments=item["arguments"], name=item["name"])
            yield self.event("response.output_item.done", output_index=index, item=item)

    def closing(self, response: dict[str, Any]) -> bytes:
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return self.event(kind, response=response)

    def failed(self, response: dict[str, Any], error: WireError) -> bytes:
        return self.event("response.failed", response={**response, "status": "failed",
                                                       "error": {"code": error.code or "server_error",
                                                                 "message": error.message}})
