"""Client messages to the chat-template messages a tool-call format renders, and model text back to tool calls.

The server speaks OpenAI's messages (``tool_calls`` on assistant messages,
``tool`` messages with results); the model reads and writes whatever the
configured tool-call format says (``hermes``: tools in the system prompt, calls
as ``<tool_call>{json}</tool_call>``, results between ``<tool_response>`` tags;
``native``: the chat template renders ``tools=`` and ``tool`` messages). The
formats are scaffold-multiturn's, used unchanged: this module only translates
between the two sides.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Sequence
from typing import Any

from scaffold_core.tool import ToolResult
from scaffold_core.tool_format import ToolCall

from .wire import Message, ToolCallSpec


class WireTool:
    """An OpenAI function spec in the shape a tool-call format describes (``name``, ``spec()``)."""

    def __init__(self, spec: dict[str, Any]):
        self._spec = spec
        self.name: str = spec["function"]["name"]
        self.description: str = spec["function"].get("description", "")

    def spec(self) -> dict[str, Any]:
        return copy.deepcopy(self._spec)


def call_tag(fmt: Any) -> str:
    return str(getattr(fmt, "call_tag", "tool_call"))


def call_text(fmt: Any, call: ToolCallSpec) -> str:
    """A call as the formats read them: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``."""
    tag = call_tag(fmt)
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<{tag}>\n{body}\n</{tag}>"


def assistant_text(fmt: Any, message: Message) -> str:
    """The text an assistant message stands for (its content, then its calls), for turns the model did not sample."""
    parts = [message.content.rstrip()] if message.content.strip() else []
    parts += [call_text(fmt, call) for call in message.tool_calls]
    return "\n".join(parts)


def template_messages(fmt: Any, messages: Sequence[Message], calls: dict[str, ToolCallSpec]) -> list[dict[str, Any]]:
    """The chat-template messages for ``messages``; ``calls`` maps call ids to the calls tool messages answer."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        if message.role == "tool":
            j = i
            while j < len(messages) and messages[j].role == "tool":
                j += 1
            out += tool_results(fmt, messages[i:j], calls)
            i = j
            continue
        if message.role == "assistant":
            out.append({"role": "assistant", "content": assistant_text(fmt, message)})
        else:
            role = "system" if message.role == "developer" else message.role
            out.append({"role": role, "content": message.content})
        i += 1
    return out


def tool_results(fmt: Any, messages: Sequence[Message], calls: dict[str, ToolCallSpec]) -> list[dict[str, Any]]:
    """One turn's ``tool`` messages as the format returns results (hermes: one message; native: one each)."""
    parsed = []
    for message in messages:
        call = calls.get(message.tool_call_id or "")
        name = call.name if call is not None else (message.name or "unknown")
        parsed.append(ToolCall(name, call.arguments if call is not None else {}, id=message.tool_call_id or ""))
    results = [ToolResult(content=m.content) for m in messages]
    return list(fmt.result_messages(parsed, results))


def calls_by_id(messages: Sequence[Message]) -> dict[str, ToolCallSpec]:
    return {call.id: call for m in messages for call in m.tool_calls if call.id}


def new_call_id() -> str:
    """A call id unique across the server's life (clients match results to calls by it)."""
    return f"call_{secrets.token_hex(12)}"


def split_tool_calls(fmt: Any, text: str) -> tuple[str, list[ToolCallSpec]]:
    """(the text outside the readable calls, the calls) of one model turn (special tokens kept in ``text``).

    A call the format cannot read stays in the text, as the model wrote it: the
    client sees it as content, never as a made-up call.
    """
    calls = []
    remaining = text
    for call in fmt.parse(text):
        if call.error is not None or not call.name:
            continue
        arguments = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        calls.append(ToolCallSpec(call.name, arguments if arguments is not None else {}, new_call_id()))
        remaining = remaining.replace(call.text, "", 1)
    return remaining.strip(), calls
