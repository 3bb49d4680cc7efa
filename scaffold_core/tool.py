"""Tools: named, schema-described async functions that an agent controller lets the model call.

What a plugin author implements
-------------------------------

Subclass :class:`Tool` and set four things:

* ``name``: what the model calls the tool (letters, digits, ``_`` or ``-``; at most 64).
* ``description``: one or two sentences telling the model what the tool does and when to use it.
* ``parameters``: a JSON Schema object (``{"type": "object", "properties": ..., "required": ...}``)
  describing the ``arguments`` dict. It is shown to the model (through :meth:`Tool.spec`, the
  OpenAI-style function spec that chat templates' ``tools=`` take) and enforced by
  :func:`invoke_tool` before :meth:`Tool.call` runs, so ``call`` only ever sees valid arguments.
* ``async def call(self, arguments, context) -> ToolResult``.

Optionally set ``timeout`` (seconds; :func:`invoke_tool` cancels a call that runs longer) and
implement ``async start()`` / ``async close()`` for resources shared by every call (an index, a
process pool, a connection); the agent controller calls them once per run, on its event loop.
A tool that runs model-written code sets ``isolation`` to how it isolates it (e.g. ``"bubblewrap"``),
and to ``"none"`` when it runs it without kernel isolation: agents then report it in every episode's
metrics (:data:`UNISOLATED_METRIC`) and the run's summary warns.

Rules that keep episodes isolated and runs healthy:

* One tool instance serves every episode, concurrently. Keep no per-call or per-episode data on
  ``self``: per-episode scratch lives in ``context.state``, a dict owned by one episode and passed
  to every call that episode makes. (Copying a :class:`Tool`, deep or shallow, returns the tool
  itself, so a controller cloned per episode shares its tools instead of copying them.)
* ``call`` must not block the event loop. Await I/O; run CPU-heavy Python in a thread
  (``asyncio.to_thread``) or, better, a subprocess that can be killed; a cancelled ``call`` must
  release what it started (``try``/``finally``), since :func:`invoke_tool` cancels it on timeout.
* Report failures as results, not exceptions: return ``ToolResult.failure(kind, message)`` or
  raise :class:`ToolCallError`; any other exception is turned into a ``"failed"`` result too, but
  a deliberate message reads better to the model.

Calling a tool
--------------

Agent controllers never call ``tool.call`` directly; they call :func:`invoke_tool`, the one place
that parses and validates arguments, bounds the call in time and turns every failure into a
:class:`ToolResult` the model can read. It never raises (except :class:`asyncio.CancelledError`,
which always propagates). :func:`check_tool` checks a tool's definition once, when it is loaded,
and raises :class:`ToolDefinitionError` naming the tool and the fix.

Tools register through the ``register_tools`` hook like every other component::

    @hookimpl
    def register_tools(registry):
        registry.add("calculator", CalculatorTool)   # CalculatorTool(**options) builds one

Tool sets
---------

Some components stand for several tools whose definitions only exist once something has started:
the tools of a Model Context Protocol server are listed by the server. Such a component is a
:class:`ToolSet`, registered through the same hook: its ``start()`` brings the source up, then
``tools()`` gives the tools (each a :class:`Tool`), and ``close()`` releases everything. An agent
expands a tool set into its tools when the run starts (:func:`is_tool_set` tells the two apart).
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import functools
import inspect
import json
import math
import re
import reprlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import TOOL_ERROR_KINDS as ERROR_KINDS
from .errors import ToolCallError, ToolDefinitionError

#: Seconds a call may take when neither the caller nor the tool says otherwise.
DEFAULT_TIMEOUT = 10.0

#: What a tool name may look like (the constraint OpenAI-style function specs put on names).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: The most characters of the model's own input an error message repeats back (a 10 MB argument is not echoed).
ECHO_LIMIT = 1000

#: The per-episode metric agents report: how many of their tools run model-written code without kernel
#: isolation (``tool.isolation == "none"``). Absent when there are none; the run's summary warns otherwise.
UNISOLATED_METRIC = "unisolated_tools"



@dataclass
class ToolResult:
    """What one tool call produced.

    ``content`` is the text the model sees next (the tool message). ``ok`` is False when the call
    failed; ``error`` then names the kind of failure, one of :data:`ERROR_KINDS`:

    * ``"bad_arguments"``: the arguments did not match the schema, or the tool refused them;
    * ``"timeout"``: the call ran past its time budget;
    * ``"failed"``: the tool raised or reported a failure;
    * ``"unknown_tool"``: the model named a tool that is not available;
    * ``"parse_error"``: the model's tool call (or its arguments) could not be parsed;
    * ``"limit"``: a resource limit was hit (CPU, memory, output size, number of calls).

    ``metadata`` carries anything worth keeping in the trajectory that the model does not see
    (timings, exit codes, the ids of retrieved documents); keep it JSON-serializable.
    """

    content: str
    ok: bool = True
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise TypeError(f"ToolResult.content must be a str, got {type(self.content).__name__}")
        if self.ok and self.error is not None:
            raise ValueError(f"ToolResult: ok=True but error={self.error!r}; set ok=False for a failure")
        if not self.ok:
            if self.error is None:
                self.error = "failed"
            elif self.error not in ERROR_KINDS:
                raise ValueError(f"ToolResult.error {self.error!r} is not one of {', '.join(ERROR_KINDS)}")

    @classmethod
    def failure(cls, kind: str, message: str, **metadata: Any) -> ToolResult:
        """A failed result of the given kind whose content is ``message``."""
        return cls(content=message, ok=False, error=kind, metadata=metadata)

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "ok": self.ok, "error": self.error, "metadata": self.metadata}


@dataclass
class ToolContext:
    """Who is calling: passed to every :meth:`Tool.call`.

    ``episode_id`` and ``call_id`` identify the episode and this call (for logs and keys).
    ``state`` is per-episode scratch: the agent controller creates one dict per episode and passes
    that same dict to every call the episode makes, so a stateful tool (a notebook, a browser
    session) keeps its state there, never on ``self``. ``row`` is the episode's dataset row, when
    there is one (read it; do not modify it).
    """

    episode_id: str
    call_id: str
    state: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] | None = None


class Tool:
    """Base class of tools. See the module docstring for the contract."""

    #: The name the model calls the tool by.
    name: str = ""
    #: What the tool does and when to use it, for the model.
    description: str = ""
    #: JSON Schema of the ``arguments`` object (type ``object``).
    parameters: dict[str, Any] = {"type": "object", "properties": {}}  # subclasses replace it, never mutate it
    #: Seconds one call may take before :func:`invoke_tool` cancels it.
    timeout: float = DEFAULT_TIMEOUT
    #: For tools that run model-written code: how it is isolated ("bubblewrap", ...; "none": not at all).
    #: None for tools that run no such code.
    isolation: str | None = None

    async def start(self) -> None:
        """Acquire resources shared by every call (called once per run, on its event loop)."""

    async def close(self) -> None:
        """Release what :meth:`start` acquired. Called once at the end of a run, even a failed one; safe twice."""

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:  # pragma: no cover
        """Run the tool on validated ``arguments``; return a :class:`ToolResult`."""
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        """The OpenAI-style function spec: ``{"type": "function", "function": {name, description, parameters}}``.

        This is what chat templates' ``tools=`` argument takes. The dict is a copy; changing it
        changes nothing on the tool.
        """
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }

    def __copy__(self) -> Tool:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Tool:
        """Tools are shared, never copied: a controller deep-copied per episode keeps the same tool
        (and whatever its ``start()`` acquired). Per-episode data belongs in ``ToolContext.state``."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class ToolSet:
    """Base class of tool sets: several tools known once :meth:`start` has run (see the module docstring).

    One tool set serves every episode, like a tool: copying it returns the object itself.
    """

    #: A short name for messages (what the config calls it).
    name: str = ""

    async def start(self) -> None:
        """Bring the source of the tools up; after it, :meth:`tools` gives them. Raise an error saying why not."""

    async def close(self) -> None:
        """Release what :meth:`start` acquired. Called once at the end of a run, even a failed one; safe twice."""

    def tools(self) -> list[Tool]:  # pragma: no cover - interface
        """The tools, after :meth:`start`."""
        raise NotImplementedError

    def __copy__(self) -> ToolSet:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ToolSet:
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def is_tool_set(component: Any) -> bool:
    """True when ``component`` is a tool set (``tools()`` and no ``call``) rather than a single tool."""
    return callable(getattr(component, "tools", None)) and not callable(getattr(component, "call", None))


# -- checking definitions --------------------------------------------------------------------


def _tool_label(tool: Any) -> str:
    name = getattr(tool, "name", None)
    return f"tool {name!r} ({type(tool).__name__})" if name else f"tool {type(tool).__name__}"


def check_tool(tool: Any) -> None:
    """Check a tool's definition; raise :class:`ToolDefinitionError` naming the tool and the fix.

    Checked: ``name`` (non-empty, letters/digits/``_``/``-``, at most 64), ``description``
    (non-empty text), ``parameters`` (a valid JSON Schema whose type is ``object``), ``timeout``
    (a positive number) and ``call`` (an ``async def`` method). Call it once when a tool is loaded.
    """
    label = _tool_label(tool)
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ToolDefinitionError(
            f"{label}: name {name!r} is not valid; set the class attribute `name` to 1-64 letters, "
            "digits, '_' or '-' (what the model calls the tool)")
    description = getattr(tool, "description", None)
    if not isinstance(description, str) or not description.strip():
        raise ToolDefinitionError(
            f"{label}: description is missing; set `description` to a sentence telling the model "
            "what the tool does and when to use it")
    parameters = getattr(tool, "parameters", None)
    if not isinstance(parameters, dict):
        raise ToolDefinitionError(
            f"{label}: parameters must be a JSON Schema dict such as "
            '{"type": "object", "properties": {...}, "required": [...]}, '
            f"got {type(parameters).__name__}")
    if parameters.get("type") != "object":
        raise ToolDefinitionError(
            f"{label}: parameters must describe an object (the arguments dict): set "
            f'"type": "object" at the top of the schema, got type {parameters.get("type")!r}')
    try:
        _validator_for(_schema_key(parameters))
    except _InvalidSchema as exc:
        raise ToolDefinitionError(f"{label}: parameters is not a valid JSON Schema: {exc}; fix the schema") from None
    timeout = getattr(tool, "timeout", None)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (timeout > 0) or math.isinf(timeout):
        raise ToolDefinitionError(f"{label}: timeout {timeout!r} must be a positive number of seconds")
    call = getattr(tool, "call", None)
    if isinstance(tool, Tool) and type(tool).call is Tool.call:
        raise ToolDefinitionError(
            f"{label}: call is not implemented; define `async def call(self, arguments, context) -> ToolResult`")
    if not inspect.iscoroutinefunction(call):
        raise ToolDefinitionError(
            f"{label}: call must be a coroutine method: define it as "
            "`async def call(self, arguments, context) -> ToolResult`")


class _InvalidSchema(Exception):
    pass


def _schema_key(schema: dict[str, Any]) -> str:
    try:
        return json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise _InvalidSchema(f"the schema is not JSON-serializable ({exc})") from None


@functools.lru_cache(maxsize=512)
def _validator_for(schema_text: str) -> Any:
    """A compiled validator for the schema (by its canonical JSON text); checks the schema once."""
    import jsonschema  # lazily: only agents pay for it
    from jsonschema.exceptions import SchemaError

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise _InvalidSchema(f"{exc.message}" + (f" (at {where})" if where else "")) from None
    return cls(schema)


# -- invoking --------------------------------------------------------------------------------


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """Arguments as a dict: a dict passes through, a JSON text is parsed, ``None`` or ``""`` is ``{}``.

    Raises :class:`ToolCallError` (kind ``parse_error`` or ``bad_arguments``) otherwise, whatever the text
    holds: JSON nested too deeply (``RecursionError``) or an integer of more digits than Python converts
    (``ValueError``) are parse errors too (:func:`json_problem` says which).
    """
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except Exception as exc:  # not only JSONDecodeError: RecursionError, ValueError (a 5000-digit integer)
            raise ToolCallError(f"{json_problem(exc, 'the arguments', plural=True)}; write them as a JSON object",
                                kind="parse_error") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(
            f"the arguments must be a JSON object, got {type(arguments).__name__} {_short(arguments)}",
            kind="bad_arguments")
    return arguments


def json_problem(exc: BaseException, subject: str, *, plural: bool = False) -> str:
    """Why ``json.loads`` refused ``subject`` (e.g. "the arguments"), as a clause for the model to read."""
    be, hold = ("are", "hold") if plural else ("is", "holds")
    if isinstance(exc, json.JSONDecodeError):
        return f"{subject} {be} not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, RecursionError):
        return f"{subject} {be} nested too deeply to read"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        most = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        return f"{subject} {hold} an integer of more than {most} digits, more than can be read (write it as a string)"
    return f"{subject} could not be read ({type(exc).__name__}: {bounded(_safe_str(exc), 300)})"


def bounded(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 3


def _short(value: Any) -> str:
    """A short repr of a value the model wrote, however large or deeply nested."""
    try:
        return _REPR.repr(value)
    except Exception:  # a RecursionError, or a repr that raises
        return f"<{type(value).__name__}>"


def _argument_errors(tool: Any, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not match the tool's schema (up to three reasons), or None."""
    validator = _validator_for(_schema_key(tool.parameters))
    errors = sorted(validator.iter_errors(arguments), key=lambda e: (list(e.path), e.message))
    if not errors:
        return None
    lines = []
    for err in errors[:3]:  # jsonschema's messages repeat the bad value whole: keep a third of the echo each
        where = bounded(".".join(str(p) for p in err.path), 100)
        message = bounded(err.message, ECHO_LIMIT // 3)
        lines.append(f"{where}: {message}" if where else message)
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(lines) + more


async def invoke_tool(tool: Any, arguments: Any, context: ToolContext, *,
                      timeout: float | None = None) -> ToolResult:
    """Call ``tool`` with ``arguments``; always return a :class:`ToolResult`.

    * ``arguments`` is a dict or a JSON text (as models write them); text that does not parse gives
      a ``parse_error`` result.
    * The arguments are validated against ``tool.parameters``; a mismatch gives a ``bad_arguments``
      result saying what is wrong, and ``call`` is not run.
    * The call is bounded by ``timeout`` (default ``tool.timeout``, else :data:`DEFAULT_TIMEOUT`
      seconds); past it, the call is cancelled and the result is a ``timeout`` failure.
    * A :class:`ToolCallError` becomes a result of its kind; any other exception a ``failed``
      result naming it. A ``call`` that returns a plain ``str`` is taken as a successful result.

    Only :class:`asyncio.CancelledError` propagates (the caller itself was cancelled).
    ``metadata["duration_s"]`` records how long the call took.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    name = getattr(tool, "name", type(tool).__name__)
    budget = timeout if timeout is not None else getattr(tool, "timeout", None)
    if budget is None or isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        budget = DEFAULT_TIMEOUT

    def finish(result: ToolResult) -> ToolResult:
        result.metadata = dict(result.metadata)
        result.metadata.setdefault("duration_s", round(loop.time() - started, 6))
        return result

    try:
        args = parse_arguments(arguments)
        try:
            problem = _argument_errors(tool, args)
        except RecursionError:
            problem = "the arguments are nested too deeply to check"
        if problem is not None:
            return finish(ToolResult.failure(
                "bad_arguments", f"bad arguments for tool {name!r}: {problem}. Expected arguments: "
                f"{_schema_summary(tool.parameters)}"))
        outcome = await asyncio.wait_for(tool.call(args, context), timeout=budget)
    except asyncio.CancelledError:
        raise
    except ToolCallError as exc:
        return finish(ToolResult(content=str(exc), ok=False, error=exc.kind, metadata=dict(exc.metadata)))
    except (asyncio.TimeoutError, TimeoutError):
        return finish(ToolResult.failure("timeout", f"tool {name!r} timed out after {budget:g} s"))
    except _InvalidSchema as exc:
        return finish(ToolResult.failure("failed", f"tool {name!r} has an invalid parameters schema: {exc}"))
    except Exception as exc:
        return finish(ToolResult.failure("failed", f"tool {name!r} failed: {type(exc).__name__}: "
                                                   f"{bounded(_safe_str(exc))}"))
    if isinstance(outcome, str):
        return finish(ToolResult(content=outcome))
    if not isinstance(outcome, ToolResult):
        return finish(ToolResult.failure(
            "failed", f"tool {name!r} returned {type(outcome).__name__}, expected a ToolResult or str"))
    return finish(outcome)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "(its message could not be shown)"


def _schema_summary(schema: dict[str, Any]) -> str:
    """``{"expression": string (required), "precision": integer}``: a compact reminder for the model."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    if not props:
        return "{}"
    parts = []
    for key, sub in props.items():
        kind = sub.get("type", "any") if isinstance(sub, dict) else "any"
        if isinstance(kind, list):
            kind = " or ".join(map(str, kind))
        parts.append(f'"{key}": {kind}' + (" (required)" if key in required else ""))
    return "{" + ", ".join(parts) + "}"


def unknown_tool(name: Any, available: Iterable[str]) -> ToolResult:
    """The result for a call to a tool that is not available (with a did-you-mean hint)."""
    names = sorted(available)
    text = name if isinstance(name, str) else _short(name)
    close = difflib.get_close_matches(text, names, n=1, cutoff=0.6) if len(text) <= 64 else []
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(names) if names else "(none)"
    return ToolResult.failure("unknown_tool", f"unknown tool {bounded(repr(text), 200)}. Available tools: "
                                              f"{listed}.{hint}")


def unisolated_tools(tools: Iterable[Any]) -> list[str]:
    """Names of the tools that run model-written code without kernel isolation (``isolation == "none"``)."""
    return [getattr(tool, "name", type(tool).__name__) for tool in tools if getattr(tool, "isolation", None) == "none"]


def tool_specs(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """The function specs of ``tools``, in order (what chat templates' ``tools=`` take)."""
    return [tool.spec() for tool in tools]
