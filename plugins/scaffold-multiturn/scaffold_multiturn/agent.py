"""The ``agent`` controller: generate, parse tool calls, run them concurrently, append the results, repeat.

One episode is one conversation, kept token-in/token-out by
:class:`~scaffold_core.conversation.Conversation`: the model's sampled ids
(loss mask 1, the engine's logprobs and policy version) interleaved with the
rendered tool results (loss mask 0, logprob 0.0, version -1). The loop ends
when the model answers (a turn without tool calls, an ``answer_tag``, or, with
``stop_on_answer``, a turn the verifier extracts an answer from), after
``max_turns`` model turns, or when the token budget runs out; before the
budget runs out the model gets one last turn told to answer now.

Everything an episode owns lives in its generator frame and in the episode
context: ``ctx.state["tool_state"]`` is the dict every tool call of the
episode (or of the branch) gets as ``ToolContext.state``. The controller holds
only its options, the tools and the format, which every episode shares (a
deep copy of the controller copies the options and shares the tools and the
format), so the default clone, a deep copy, is all an episode needs.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from annotated_types import Ge, Gt

from scaffold_core.chat_template import render_text
from scaffold_core.controller import Controller, samples_in_parallel
from scaffold_core.conversation import Conversation, DriftReport
from scaffold_core.episode import EpisodeContext, Outcome, Sample
from scaffold_core.errors import TOOL_ERROR_KINDS as ERROR_KINDS
from scaffold_core.errors import (
    ConfigError,
    EpisodeError,
    PluginLoadError,
    ToolDefinitionError,
    ToolFormatError,
    UnknownComponentError,
)
from scaffold_core.generation import AwaitTask, VerificationTask
from scaffold_core.plugins import Help, current_path, current_registry
from scaffold_core.plugins import build_tool_format as build_format
from scaffold_core.tokenizers import encode
from scaffold_core.tool import (
    UNISOLATED_METRIC,
    Tool,
    ToolContext,
    ToolResult,
    bounded,
    check_tool,
    is_tool_set,
    unisolated_tools,
)
from scaffold_core.tool_format import ToolCall, ToolFormat, ToolPrompt, call_timeout, run_tool_call, unrunnable

log = logging.getLogger("scaffold.agent")

#: What the model is told before its last turn when the turn or token budget is about to run out.
DEFAULT_ANSWER_NOW = ("You have used up your budget for tool calls. Do not call any more tools: "
                      "give your final answer now.")

#: Seconds an awaited tool call may run past its own timeout before the episode fails. ``invoke_tool``
#: cancels a call at its timeout and returns a ``timeout`` result; this bound only catches a tool
#: that ignores cancellation.
GRACE_S = 5.0

#: How an episode can end (``metadata["end"]``).
ENDS = ("answer", "max_turns", "context")


# -- building ------------------------------------------------------------------------------


def _component(kind: str, spec: Any, path: str, method: str) -> Any:
    """The ``kind`` component ``spec`` names, or ``spec`` itself when it has the component's ``method``."""
    try:
        return current_registry().build(kind, spec, path=path, accepts=lambda obj: callable(getattr(obj, method, None)))
    except (UnknownComponentError, PluginLoadError) as exc:
        raise ConfigError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from exc


def build_tools(specs: Any, path: str) -> dict[str, Any]:
    """The tools named in ``specs`` (names, ``{name: ..., options...}`` or tool objects), by the name models call.

    Tool sets (:class:`~scaffold_core.tool.ToolSet`, e.g. an MCP server's tools) are left out here:
    :func:`build_tools_and_sets` returns those too, and the agent adds their tools when the run starts.
    """
    tools, _ = build_tools_and_sets(specs, path)
    return tools


def build_tools_and_sets(specs: Any, path: str) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """(the tools by name, the tool sets with their config paths) that ``specs`` names."""
    if not specs:
        names = ", ".join(current_registry().names("tool")) or "(none installed: pip install scaffold-tools)"
        raise ConfigError(f"{path}: the agent needs at least one tool; choose from: {names} "
                          "(e.g. tools: [calculator, {name: search, top_k: 3}])")
    if not isinstance(specs, (list, tuple)):
        raise ConfigError(f"{path}: expected a list of tools, got {specs!r}")
    tools: dict[str, Any] = {}
    sets: list[tuple[str, Any]] = []
    for i, spec in enumerate(specs):
        where = f"{path}[{i}]"
        tool = spec if is_tool_set(spec) else _component("tool", spec, where, "call")
        if is_tool_set(tool):
            sets.append((where, tool))
            continue
        add_tool(tools, tool, where)
    return tools, sets


def add_tool(tools: dict[str, Any], tool: Any, where: str) -> None:
    """Check ``tool`` and add it to ``tools`` under its name; a clash with a tool already there is an error."""
    if tools.get(str(getattr(tool, "name", ""))) is tool:
        return  # already there (a tool set's tools, added by an earlier start)
    try:
        check_tool(tool)
    except ToolDefinitionError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if tool.name in tools:
        raise ConfigError(f"{where}: two tools are both called {tool.name!r}; the model could not tell them "
                          "apart: keep one")
    tools[tool.name] = tool


#: Arguments nested deeper than this are logged as (bounded) text: run files must stay writable and readable.
MAX_LOGGED_DEPTH = 64


def _depth(value: Any) -> int:
    """How deeply ``value`` nests dicts and lists (iteratively: any depth)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            items = list(item.values())
        elif isinstance(item, (list, tuple)):
            items = list(item)
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_LOGGED_DEPTH:
            break
        stack.extend((child, level + 1) for child in items)
    return deepest


def _jsonable(value: Any) -> Any:
    """``value`` when it is plain JSON of reasonable depth, else a bounded text standing for it."""
    try:
        if _depth(value) <= MAX_LOGGED_DEPTH:
            json.dumps(value)
            return value
    except Exception:  # not JSON (TypeError), a NaN (ValueError), an integer too long to print
        pass
    try:
        return bounded(repr(value))
    except Exception:  # RecursionError
        return f"<{type(value).__name__} that cannot be shown>"


@dataclass
class _Tally:
    """One episode's tool calls: a log for the metadata and counts for the metrics."""

    log: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    skipped: int = 0

    def record(self, turn: int, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> None:
        for call, result in zip(calls, results):
            if not result.ok:
                self.errors[result.error or "failed"] = self.errors.get(result.error or "failed", 0) + 1
            self.log.append({"turn": turn, "id": call.id, "name": call.name, "arguments": _jsonable(call.arguments),
                             "ok": result.ok, "error": result.error, "metadata": _jsonable(result.metadata)})


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "(no message)"


_WARNED_FORMATS: set[str] = set()


def _warn_parse_raised(format_name: str, exc: BaseException) -> None:
    """Say once per format that its parse() raised (a format should return unreadable calls with error set)."""
    if format_name not in _WARNED_FORMATS:
        _WARNED_FORMATS.add(format_name)
        log.warning("tool format %r raised %s in parse(); the model got a parse_error result instead (a format "
                    "returns unreadable calls with error set)", format_name, type(exc).__name__)


class AgentController(Controller):
    """A tool-calling agent: the model calls tools until it answers, ``max_turns``, or the token budget.

    Options:

    * ``tools``: the tools the model may call: registered names or
      ``{name: ..., options...}`` (required), e.g. ``[calculator, {name: search, top_k: 3}]``.
    * ``format`` (``hermes``): the tool-call format, a registered name or
      ``{name: ..., options...}``: how tools are shown, calls read and results returned.
    * ``max_turns`` (4): model turns at most; the calls of the last allowed turn are not run.
    * ``max_total_tokens`` (none): the conversation never grows past this many tokens.
    * ``answer_now`` (a sentence): told to the model before its last turn, when the next turn
      is the last ``max_turns`` allows or the token budget is about to run out; null: never.
    * ``answer_reserve`` (none: ``sampling.max_tokens``): with ``max_total_tokens``, the
      answer-now turn comes when fewer than this many tokens would be left after the next turn.
    * ``answer_tag`` (none): e.g. ``answer``: a turn holding ``<answer>...</answer>`` ends the
      episode (its calls are not run) and the tag's content is the response scored.
    * ``stop_on_answer`` (false): a turn with tool calls from which the verifier extracts an
      answer also ends the episode (one verification per such turn).
    * ``max_calls_per_turn`` (8): calls past it get a ``limit`` error result, unrun.
    * ``tool_timeout`` (none: each tool's own): seconds per call.
    * ``samples`` (1): independent episodes per prompt, run concurrently.
    * ``drift_check`` (true): compare the ids with a fresh render of the whole conversation.
    """

    def __init__(self, tools: list[str | dict[str, Any]] | None = None, format: str | dict[str, Any] = "hermes",
                 max_turns: Annotated[int, Ge(1), Help("model turns per episode")] = 4,
                 max_total_tokens: Annotated[int, Ge(2), Help("the conversation's tokens (null: no limit)")] | None
                 = None,
                 answer_now: str | None = DEFAULT_ANSWER_NOW,
                 answer_reserve: Annotated[int, Ge(0), Help("tokens kept for the answer-now turn")] | None = None,
                 answer_tag: str | None = None, stop_on_answer: bool = False,
                 max_calls_per_turn: Annotated[int, Ge(1), Help("calls past it get a limit error, unrun")] = 8,
                 tool_timeout: Annotated[float, Gt(0), Help("seconds per call (null: each tool's own)")] | None = None,
                 samples: Annotated[int, Ge(1), Help("episodes per prompt, run concurrently")] = 1,
                 drift_check: bool = True):
        if answer_now is not None and not answer_now.strip():
            raise ValueError("answer_now must be a message (or null for no answer-now turn)")
        if answer_tag is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,40}", answer_tag):
            raise ValueError(f"answer_tag must be a tag name such as 'answer', got {answer_tag!r}")
        path = current_path("controller")
        self.tools: dict[str, Tool]
        self.tools, self.tool_sets = build_tools_and_sets(tools, f"{path}.tools")
        self.format: ToolFormat = build_format(format, f"{path}.format")
        self.format_name: str = getattr(self.format, "name", "") or type(self.format).__name__
        self.max_turns = max_turns
        self.max_total_tokens = max_total_tokens
        self.answer_now = answer_now
        self.answer_reserve = answer_reserve
        self.answer_tag = answer_tag
        self.stop_on_answer = stop_on_answer
        self.max_calls_per_turn = max_calls_per_turn
        self.tool_timeout = tool_timeout
        self.samples = samples
        self.drift_check = drift_check

    async def start(self) -> None:
        """Start every tool set and add its tools, then start every tool (once per run, on the run's event loop)."""
        for where, tool_set in self.tool_sets:
            await tool_set.start()
            for tool in tool_set.tools():
                add_tool(self.tools, tool, where)
        for tool in self.tools.values():
            start = getattr(tool, "start", None)
            if start is not None:
                await start()

    async def close(self) -> None:
        """Close every tool and tool set, even when one fails to close (the first error is raised after all were
        tried)."""
        errors: list[BaseException] = []
        for tool in [*self.tools.values(), *(tool_set for _, tool_set in self.tool_sets)]:
            close = getattr(tool, "close", None)
            if close is None:
                continue
            try:
                await close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- episodes --------------------------------------------------------------------------
    def process(self, ctx: EpisodeContext):
        if self.samples == 1:
            sample, metrics = yield from self.run_agent(ctx)
            return Outcome(samples=[sample], chosen=0, metrics=metrics)
        return (yield from samples_in_parallel(self, ctx))

    def run_agent(self, ctx: EpisodeContext):
        """One agent episode; returns (its Sample, its metrics)."""
        conv, prompt = self._begin(ctx)
        tool_state: dict[str, Any] = ctx.state.setdefault("tool_state", {})
        tally = _Tally()
        end, forced, answer, verdict = "max_turns", None, None, None
        for turn in range(self.max_turns):
            task = ctx.generation_task(0, prompt_ids=conv.ids, sampling=self._sampling(ctx, conv), turn=turn)
            yield [task]
            model_turn = conv.add_model_turn(task.need_result())
            answer = self._tagged_answer(model_turn.text)
            calls = [] if answer is not None else self._parse(conv.messages[-1]["content"])
            if not calls:
                end = "answer"
                break
            if self.stop_on_answer:
                check = VerificationTask(model_turn.text, ctx.reference)
                yield [check]
                if check.need_verdict().extracted is not None:
                    end, verdict = "answer", check.verdict
                    break
            if forced is not None or turn + 1 == self.max_turns:
                tally.skipped += len(calls)
                end = forced or "max_turns"
                break
            results = yield from self._call_tools(ctx, calls, turn, tool_state)
            tally.record(turn, calls, results)
            out_of_room, forced = self._append_results(ctx, conv, calls, results, turn)
            if out_of_room:
                end = "context"
                break
        return self._finish(ctx, conv, prompt, tally, end, forced, answer, verdict)

    # -- the steps ---------------------------------------------------------------------------
    def _begin(self, ctx: EpisodeContext) -> tuple[Conversation, ToolPrompt]:
        if ctx.messages is None:
            raise EpisodeError("the agent needs the task's prompt as chat messages, and this task built its prompt "
                               "without them (override messages(row) instead of build_prompt)", component="task")
        if ctx.tokenizer is None:
            raise EpisodeError("the agent needs the engine's tokenizer in the episode context", component="task")
        try:
            prompt = self.format.prompt(ctx.messages, list(self.tools.values()), ctx.tokenizer)
        except ToolFormatError as exc:
            raise EpisodeError(str(exc), component="tool_format") from exc
        except Exception as exc:
            raise EpisodeError(f"tool format {self.format_name!r} raised {type(exc).__name__} in prompt(): {exc}",
                               component="tool_format") from exc
        if not isinstance(prompt, ToolPrompt):
            raise EpisodeError(f"tool format {self.format_name!r}: prompt() returned {type(prompt).__name__}; "
                               "return a ToolPrompt(messages, template_kwargs)", component="tool_format")
        text = render_text(ctx.tokenizer, prompt.messages, add_generation_prompt=True,
                           template_kwargs=prompt.template_kwargs)
        conv = Conversation(ctx.tokenizer, prompt.messages, encode(ctx.tokenizer, text), text,
                            template_kwargs=prompt.template_kwargs)
        if self.max_total_tokens is not None and len(conv) >= self.max_total_tokens:
            raise EpisodeError(f"the prompt (with the tool descriptions) has {len(conv)} tokens, no fewer than "
                               f"controller.max_total_tokens ({self.max_total_tokens}): raise max_total_tokens, "
                               "or shorten the prompt", component="task")
        return conv, prompt

    def _sampling(self, ctx: EpisodeContext, conv: Conversation) -> Any:
        if self.max_total_tokens is None:
            return ctx.sampling
        room = self.max_total_tokens - len(conv)
        return ctx.sampling.replace(max_tokens=max(1, min(ctx.sampling.max_tokens, room)))

    def _tagged_answer(self, text: str) -> str | None:
        if self.answer_tag is None:
            return None
        found = re.findall(rf"<{self.answer_tag}>(.*?)</{self.answer_tag}>", text, flags=re.S)
        return found[-1].strip() if found else None

    def _parse(self, content: str) -> list[ToolCall]:
        try:
            calls = self.format.parse(content)
        except Exception as exc:  # the model's text made the format fail: the model reads a parse error
            _warn_parse_raised(self.format_name, exc)
            return [ToolCall("", bounded(content), id="call_0", text=content,
                             error=f"the tool calls in this reply could not be read ({type(exc).__name__}: "
                                   f"{bounded(_message(exc), 300)}); write each call as the tool descriptions say")]
        if not isinstance(calls, list) or not all(isinstance(c, ToolCall) for c in calls):
            raise EpisodeError(f"tool format {self.format_name!r}: parse() must return a list of ToolCall",
                               component="tool_format")
        return calls

    def _call_tools(self, ctx: EpisodeContext, calls: list[ToolCall], turn: int, tool_state: dict[str, Any]):
        """Run a turn's calls concurrently, each bounded; returns one ToolResult per call."""
        results: list[ToolResult | None] = [None] * len(calls)
        pending: list[tuple[int, AwaitTask]] = []
        for i, call in enumerate(calls):
            if i >= self.max_calls_per_turn:
                results[i] = ToolResult.failure(
                    "limit", f"not run: at most {self.max_calls_per_turn} tool calls are run per turn")
                continue
            results[i] = unrunnable(call, self.tools)
            if results[i] is not None:
                continue
            context = ToolContext(episode_id=ctx.episode_id, state=tool_state, row=ctx.row,
                                  call_id=f"{ctx.episode_id}/{ctx.attempt}/{ctx.sample_base}/{turn}/{i}")
            budget = call_timeout(call, self.tools, self.tool_timeout)
            pending.append((i, AwaitTask(functools.partial(run_tool_call, call, self.tools, context, timeout=budget),
                                         timeout=budget + GRACE_S, component="tool", what=f"tool {call.name!r}")))
        if pending:
            yield [task for _, task in pending]
        for i, task in pending:
            results[i] = task.result if isinstance(task.result, ToolResult) else ToolResult.failure(
                "failed", f"tool {calls[i].name!r} returned no result")
        return [r for r in results if r is not None]

    def _append_results(self, ctx: EpisodeContext, conv: Conversation, calls: list[ToolCall],
                        results: list[ToolResult], turn: int) -> tuple[bool, str | None]:
        """Append the results (and, when the budget is about to run out, the answer-now message).

        Returns (no room left for them: the episode ends, why the next turn is the last or None).
        """
        messages = self._result_messages(calls, results)
        ids, text = conv.environment_tokens(messages)
        forced = None
        if self.answer_now is not None:
            if turn + 2 == self.max_turns:
                forced = "max_turns"
            elif self.max_total_tokens is not None:
                room = self.max_total_tokens - len(conv) - len(ids)
                reserve = ctx.sampling.max_tokens if self.answer_reserve is None else self.answer_reserve
                if room - ctx.sampling.max_tokens < reserve:
                    forced = "context"
            if forced is not None:
                messages = [*messages, {"role": "user", "content": self.answer_now}]
                ids, text = conv.environment_tokens(messages)
        if self.max_total_tokens is not None and len(conv) + len(ids) >= self.max_total_tokens:
            return True, forced
        conv.add_environment(messages, ids, text)
        return False, forced

    def _result_messages(self, calls: list[ToolCall], results: list[ToolResult]) -> list[dict[str, Any]]:
        try:
            messages = self.format.result_messages(calls, results)
        except Exception as exc:
            raise EpisodeError(f"tool format {self.format_name!r} raised {type(exc).__name__} in result_messages(): "
                               f"{exc}", component="tool_format") from exc
        if not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                   and isinstance(m.get("content"), str) for m in messages):
            raise EpisodeError(f"tool format {self.format_name!r}: result_messages() must return a non-empty list of "
                               "{'role': str, 'content': str} messages", component="tool_format")
        return messages

    def _finish(self, ctx: EpisodeContext, conv: Conversation, prompt: ToolPrompt, tally: _Tally, end: str,
                forced: str | None, answer: str | None, verdict: Any) -> tuple[Sample, dict[str, float]]:
        report = conv.drift() if self.drift_check else None
        last = conv.turns[-1]
        metadata: dict[str, Any] = {
            "turns": [t.to_dict(len(conv.prompt_ids)) for t in conv.turns],
            "end": end,
            "forced_answer": forced,
            "messages": conv.messages[len(prompt.messages):],
            "tool_calls": tally.log,
            "tool_format": self.format_name,
        }
        unisolated = unisolated_tools(self.tools.values())
        if unisolated:
            metadata["unisolated_tools"] = unisolated
        if report is not None:
            metadata["drift"] = report.to_dict()
        sample = Sample(
            prompt_ids=list(conv.prompt_ids), output_ids=conv.output_ids, output_logprobs=conv.output_logprobs,
            output_mask=conv.output_mask, text=answer if answer is not None else last.text,
            finish_reason=last.finish_reason, sample_index=ctx.sample_base,
            weight_version=conv.turns[0].weight_version, verdict=verdict, metadata=metadata,
            versions=conv.output_versions,
        )
        return sample, self._metrics(len(conv.turns), end, forced, tally, report)

    def _metrics(self, turns: int, end: str, forced: str | None, tally: _Tally,
                 report: DriftReport | None) -> dict[str, float]:
        metrics = {
            "turns": float(turns),
            "tool_calls": float(len(tally.log)),
            "tool_errors": float(sum(tally.errors.values())),
            "tool_calls_skipped": float(tally.skipped),
            "answered": float(end == "answer"),
            "forced_answer": float(forced is not None),
            "max_turns_reached": float(end == "max_turns"),
            "context_exhausted": float(end == "context"),
        }
        metrics.update({f"tool_error_{kind}": float(n) for kind, n in tally.errors.items()})
        unisolated = unisolated_tools(self.tools.values())
        if unisolated:  # tools that ran model-written code without kernel isolation: the summary warns
            metrics[UNISOLATED_METRIC] = float(len(unisolated))
        if report is not None:
            metrics["drift"] = float(report.drift)
            metrics["drift_template"] = float(report.kind == "template")
            metrics["drift_boundary"] = float(report.kind == "boundary")
            metrics["retokenize_mismatch"] = float(bool(report.noncanonical_turns))
        return metrics
