"""Tool-call formats: how an agent shows tools to the model, reads the calls it writes, and returns results.

Models are trained on one convention or another: Hermes and Qwen models write
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and read results
between ``<tool_response>`` tags; some chat templates render the tools
themselves (``apply_chat_template(..., tools=[...])``) and a ``tool`` role for
results. A format is a component (kind ``tool_format``, hook
``register_tool_formats``) that an agent controller selects by name
(``format: hermes``), so a new convention is a plugin, not a fork.

What a plugin author implements
-------------------------------

Subclass :class:`ToolFormat` and implement three methods:

* ``prompt(messages, tools, tokenizer) -> ToolPrompt``: the chat messages and
  the chat-template keyword arguments that present ``tools`` to the model
  (a description added to the system prompt, or ``{"tools": specs}`` for a
  template that renders them). Raise :class:`ToolFormatError` when the format
  cannot work with this tokenizer, saying which format to use instead.
* ``parse(text) -> list[ToolCall]``: the calls in one model turn, in order
  (none: the model answered). A call that cannot be read is still returned,
  as a :class:`ToolCall` with ``error`` set: the agent turns it into a
  ``parse_error`` result the model reads, never an exception.
* ``result_messages(calls, results) -> list[dict]``: the chat messages that
  carry the results back (``results[i]`` answers ``calls[i]``).

One format object serves every episode, concurrently: keep no per-episode
data on it (copying a :class:`ToolFormat` returns the object itself, as for
tools). Formats register like every component::

    @hookimpl
    def register_tool_formats(registry):
        registry.add("hermes", HermesFormat)    # HermesFormat(**options) builds one

:func:`run_tool_call` is how an agent runs one parsed call: unknown tools,
unreadable calls, bad arguments, timeouts and tool failures all come back as
:class:`~scaffold_core.tool.ToolResult` failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ToolFormatError
from .tool import DEFAULT_TIMEOUT, ToolContext, ToolResult, invoke_tool, unknown_tool

__all__ = ["ToolCall", "ToolFormat", "ToolFormatError", "ToolPrompt", "call_timeout", "format_error",
           "result_text", "run_tool_call", "unrunnable"]


@dataclass(slots=True)
class ToolCall:
    """One call the model wrote.

    ``name`` is the tool it names (``""`` when none could be read);
    ``arguments`` the arguments as parsed (a dict), or their text when the
    format leaves parsing to :func:`~scaffold_core.tool.invoke_tool`; ``id``
    an identifier for matching results to calls (``call_0``, ... when the
    model gave none); ``text`` the call as the model wrote it. ``error`` says
    why the call could not be read (it is then answered with a
    ``parse_error`` result and no tool runs).
    """

    name: str
    arguments: Any = None
    id: str = ""
    text: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "id": self.id, "error": self.error}


@dataclass(slots=True)
class ToolPrompt:
    """What a format makes of the task's prompt: ``messages`` to render, with ``template_kwargs``.

    ``template_kwargs`` go to every ``apply_chat_template`` call of the
    conversation (e.g. ``{"tools": [spec, ...]}``), so later turns render
    under the same template arguments as the prompt.
    """

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] = field(default_factory=dict)


class ToolFormat:
    """Base class of tool-call formats. See the module docstring for the contract."""

    #: The format's registered name, for metadata and messages (set by subclasses).
    name: str = ""

    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any], tokenizer: Any) -> ToolPrompt:
        """The messages (a new list; never modify ``messages``) and template arguments that present ``tools``."""
        raise NotImplementedError

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in one model turn's text (special tokens kept), in order; malformed ones with ``error`` set."""
        raise NotImplementedError

    def result_messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        """The chat messages that return ``results`` (one per call, same order) to the model."""
        raise NotImplementedError

    def __copy__(self) -> ToolFormat:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ToolFormat:
        """Formats are shared, never copied: a controller deep-copied per episode keeps the same format."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def result_text(result: ToolResult) -> str:
    """What the model reads for a result: its content, prefixed ``Error (kind):`` when the call failed."""
    if result.ok:
        return result.content
    return f"Error ({result.error}): {result.content}"


def call_timeout(call: ToolCall, tools: Mapping[str, Any], timeout: float | None = None) -> float:
    """Seconds :func:`run_tool_call` allows ``call``: ``timeout``, else the tool's own, else the default."""
    if timeout is not None:
        return float(timeout)
    tool = tools.get(call.name)
    budget = getattr(tool, "timeout", None)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        return DEFAULT_TIMEOUT
    return float(budget)


def unrunnable(call: ToolCall, tools: Mapping[str, Any]) -> ToolResult | None:
    """The result of a call that cannot run (unreadable: ``parse_error``; unknown tool: ``unknown_tool``), else None."""
    if call.error is not None:
        return ToolResult.failure("parse_error", call.error)
    if call.name not in tools:
        return unknown_tool(call.name, tools)
    return None


async def run_tool_call(call: ToolCall, tools: Mapping[str, Any], context: ToolContext, *,
                        timeout: float | None = None) -> ToolResult:
    """Run one parsed call against ``tools`` (name -> tool); always a :class:`ToolResult`, never an exception.

    An unreadable call gives ``parse_error``, a name not in ``tools`` gives
    ``unknown_tool`` (with a did-you-mean hint); otherwise
    :func:`~scaffold_core.tool.invoke_tool` validates the arguments and bounds
    the call by ``timeout`` (default: the tool's). Only
    :class:`asyncio.CancelledError` propagates.
    """
    refused = unrunnable(call, tools)
    if refused is not None:
        return refused
    return await invoke_tool(tools[call.name], call.arguments, context, timeout=call_timeout(call, tools, timeout))


def format_error(fmt: Any, message: str) -> ToolFormatError:
    """A :class:`ToolFormatError` naming the format ``fmt``."""
    name = getattr(fmt, "name", "") or type(fmt).__name__
    return ToolFormatError(f"tool format {name!r}: {message}")
