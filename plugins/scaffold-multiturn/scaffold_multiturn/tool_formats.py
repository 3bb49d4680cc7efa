"""The built-in tool-call formats: ``hermes`` (tools described in the system prompt) and ``native`` (``tools=``).

Both read calls written the Hermes/Qwen way, a JSON object between tags::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "48 / 2"}}
    </tool_call>

They differ in how the tools and the results reach the model:

* ``hermes`` describes the tools in the system prompt itself (between
  ``<tools>`` tags, one JSON function spec per line) and returns all of a
  turn's results in one ``user`` message, each between ``<tool_response>``
  tags. It needs nothing from the chat template, so it works with any chat
  model (SmolLM2's plain ChatML template included).
* ``native`` passes the tools to the chat template (``tools=``) and returns
  each result as a ``tool`` message, so the template renders both as the model
  was trained to see them (Qwen2.5 and Hermes templates, for example). It
  refuses a tokenizer whose template ignores ``tools=``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from scaffold_core.chat_template import render_text
from scaffold_core.tool import ToolResult, bounded, json_problem
from scaffold_core.tool_format import ToolCall, ToolFormat, ToolPrompt, format_error, result_text

#: The default description of the tools for ``hermes``; ``{tools}``, ``{call}`` and ``{response}`` are replaced
#: by the function specs (one JSON object per line) and the call and response tag names.
DEFAULT_TOOLS_PROMPT = (
    "# Tools\n\n"
    "You have tools you can call while you work. Their descriptions follow, one JSON object per line, "
    "between <tools> and </tools>:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "To call a tool, write a JSON object with the tool's \"name\" and its \"arguments\" between "
    "<{call}> and </{call}>, like this:\n"
    "<{call}>\n{\"name\": \"<tool name>\", \"arguments\": {<arguments as JSON>}}\n</{call}>\n"
    "You may call several tools in one reply. Each result comes back between <{response}> and </{response}>. "
    "When you have what you need, reply without a tool call."
)

#: Longest call id taken from the model (longer ones are replaced by ``call_<n>``) and tool name kept whole.
MAX_ID_CHARS = 128
MAX_NAME_CHARS = 128
_TAG_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,40}$")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _check_tag(option: str, tag: str) -> str:
    if not _TAG_NAME.match(tag):
        raise ValueError(f"{option} must be a tag name such as 'tool_call' (letters, digits, _ . : -), got {tag!r}")
    return tag


def parse_tagged_calls(text: str, tag: str = "tool_call") -> list[ToolCall]:
    """Every ``<tag>{json}</tag>`` in ``text``, in order; unreadable ones carry ``error``.

    The JSON object needs a string ``name``; its arguments are ``arguments``
    (or ``parameters``), an object or a JSON text. An opening tag without a
    closing one (a turn cut short) is an unreadable call too.
    """
    opening, closing = f"<{tag}>", f"</{tag}>"
    calls: list[ToolCall] = []
    at = 0
    while True:
        start = text.find(opening, at)
        if start < 0:
            break
        end = text.find(closing, start + len(opening))
        index = len(calls)
        if end < 0:
            raw = text[start:]
            calls.append(ToolCall("", raw[len(opening):].strip(), id=f"call_{index}", text=raw,
                                  error=f"the tool call is not closed: end it with {closing}"))
            break
        raw = text[start:end + len(closing)]
        calls.append(_read_call(text[start + len(opening):end], raw, index, opening, closing))
        at = end + len(closing)
    return calls


def _read_call(body: str, raw: str, index: int, opening: str, closing: str) -> ToolCall:
    body = body.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    shape = f'write {opening}{{"name": "<tool name>", "arguments": {{...}}}}{closing}'
    try:
        obj = json.loads(body)
    except Exception as exc:  # not only JSONDecodeError: RecursionError, ValueError (a 5000-digit integer)
        return ToolCall("", body, id=f"call_{index}", text=raw, error=f"{json_problem(exc, 'the tool call')}; {shape}")
    if not isinstance(obj, dict):
        return ToolCall("", body, id=f"call_{index}", text=raw,
                        error=f"the tool call must be a JSON object, got {type(obj).__name__}; {shape}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCall("", body, id=f"call_{index}", text=raw,
                        error=f'the tool call has no "name" naming the tool; {shape}')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    given = obj.get("id")
    call_id = given if isinstance(given, str) and 0 < len(given) <= MAX_ID_CHARS else f"call_{index}"
    # A tool name is at most 64 characters: a longer one is unknown anyway, and goes back to the model cut short.
    return ToolCall(bounded(name.strip(), MAX_NAME_CHARS), arguments, id=call_id, text=raw)


def _spec_lines(tools: Sequence[Any]) -> str:
    return "\n".join(json.dumps(tool.spec(), ensure_ascii=False) for tool in tools)


class HermesFormat(ToolFormat):
    """Tools in the system prompt, calls as ``<tool_call>{json}</tool_call>``, results as ``<tool_response>``s.

    Options: ``tools_prompt`` (the text describing the tools, added to the
    system prompt; ``{tools}``, ``{call}`` and ``{response}`` are replaced by
    the function specs, one JSON object per line, and the tag names),
    ``call_tag`` and ``response_tag`` (``tool_call``, ``tool_response``),
    ``response_role`` (``user``: the role of the message carrying a turn's
    results).
    """

    name = "hermes"

    def __init__(self, tools_prompt: str = DEFAULT_TOOLS_PROMPT, call_tag: str = "tool_call",
                 response_tag: str = "tool_response", response_role: str = "user"):
        if "{tools}" not in tools_prompt:
            raise ValueError("tools_prompt must contain {tools}, where the tool descriptions go")
        self.tools_prompt = tools_prompt
        self.call_tag = _check_tag("call_tag", call_tag)
        self.response_tag = _check_tag("response_tag", response_tag)
        if not response_role or not response_role.isidentifier():
            raise ValueError(f"response_role must be a chat role such as 'user' or 'tool', got {response_role!r}")
        self.response_role = response_role

    def describe(self, tools: Sequence[Any]) -> str:
        """The text added to the system prompt."""
        text = self.tools_prompt.replace("{call}", self.call_tag).replace("{response}", self.response_tag)
        return text.replace("{tools}", _spec_lines(tools))

    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any], tokenizer: Any) -> ToolPrompt:
        description = self.describe(tools)
        out = [dict(m) for m in messages]
        if out and out[0].get("role") == "system":
            system = str(out[0].get("content") or "").rstrip()
            out[0]["content"] = f"{system}\n\n{description}" if system else description
        else:
            out.insert(0, {"role": "system", "content": description})
        return ToolPrompt(out)

    def parse(self, text: str) -> list[ToolCall]:
        return parse_tagged_calls(text, self.call_tag)

    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        blocks = [f"<{self.response_tag}>\n{result_text(r)}\n</{self.response_tag}>" for r in results]
        return [{"role": self.response_role, "content": "\n".join(blocks)}]


class NativeFormat(ToolFormat):
    """The chat template renders the tools (``tools=``) and ``tool`` messages; calls as ``<tool_call>{json}``.

    For models whose template knows tools (Qwen2.5, Hermes 2/3, ...): the
    prompt and the results look exactly as in the model's training. Option
    ``call_tag`` (``tool_call``). Fails each episode with a clear error when
    the tokenizer's chat template ignores ``tools=`` (use ``hermes`` there).
    """

    name = "native"

    def __init__(self, call_tag: str = "tool_call"):
        self.call_tag = _check_tag("call_tag", call_tag)

    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any], tokenizer: Any) -> ToolPrompt:
        specs = [tool.spec() for tool in tools]
        probe = [{"role": "user", "content": "?"}]
        try:
            plain = render_text(tokenizer, probe, add_generation_prompt=True)
            with_tools = render_text(tokenizer, probe, add_generation_prompt=True, template_kwargs={"tools": specs})
        except Exception as exc:
            raise format_error(self, f"the chat template cannot render tools= ({exc}); use format: hermes") from exc
        if plain == with_tools:
            raise format_error(self, f"the chat template of {type(tokenizer).__name__} ignores tools= (it does not "
                                     "render tool descriptions); use format: hermes, which describes the tools in "
                                     "the system prompt")
        return ToolPrompt([dict(m) for m in messages], {"tools": specs})

    def parse(self, text: str) -> list[ToolCall]:
        return parse_tagged_calls(text, self.call_tag)

    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        return [{"role": "tool", "name": call.name or "unknown", "tool_call_id": call.id, "content": result_text(r)}
                for call, r in zip(calls, results)]
