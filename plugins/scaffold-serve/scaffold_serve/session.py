"""A session: every call one client made, and the token-faithful conversations they built.

The prefix invariant: when a request's messages repeat a conversation's history
(up to and including the model's last turn there) and add new ones, the new
prompt is that conversation's ids (the previous prompt and the ids the model
sampled) plus the rendered *new* messages only. History is never re-tokenized.

How a request is matched (:meth:`Session.plan`), against every conversation of
the session, most recent first:

* ``extend``: it repeats a conversation's whole history: the new messages are appended.
* ``fork``: it repeats a conversation up to one of the model's turns and then goes another
  way (a retry, another tool result): a new conversation keeps those turns' ids.
* ``edit``: it changed a message the model had written (or the tools): the history is
  *drift*. The call still works, on a new conversation (a fork before the edited turn,
  the edited text rendered as environment tokens), and the split is recorded with
  where the token sequences part (``drift``) and counted.
* ``new``: nothing the model wrote in this session is in it: a fresh conversation.

Each choice of an ``n > 1`` request continues its own copy (``choice``). Sessions are
touched only on the server's event loop: no locks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.chat_template import decode_keep_special
from scaffold_core.generation import GenerationResult

from .render import WireTool, calls_by_id, split_tool_calls, template_messages
from .trajectory import EnvStep, Start, Trajectory
from .wire import ChatRequest, Message, ToolCallSpec, WireError, wire_tool_call

#: Responses API responses a session keeps for ``previous_response_id``.
MAX_STORED = 1024


@dataclass(slots=True)
class Plan:
    """What a request will do to its session, worked out before anything is generated (nothing changed yet)."""

    kind: str
    prompt_ids: list[int]
    tools_key: str
    base: Trajectory | None = None
    base_turns: int = 0
    start: Start | None = None
    env: EnvStep | None = None
    new_keys: list[tuple[Any, ...]] = field(default_factory=list)
    new_messages: list[dict[str, Any]] = field(default_factory=list)
    drift: dict[str, Any] | None = None


@dataclass(slots=True)
class Choice:
    """One generated choice as the client sees it."""

    index: int
    result: GenerationResult
    content: str | None
    tool_calls: list[ToolCallSpec]
    finish_reason: str
    trajectory: int
    #: The stop string the output ended on (cut from ``content``, as OpenAI does), if any.
    stop_sequence: str | None = None

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [wire_tool_call(c) for c in self.tool_calls]
        return out


class Session:
    """One client's calls and conversations (see the module docstring)."""

    def __init__(self, session_id: str, tokenizer: Any, tool_format: Any, *, reference: Any = None,
                 metadata: dict[str, Any] | None = None):
        self.id = session_id
        self.tokenizer = tokenizer
        self.format = tool_format
        self.reference = reference
        self.metadata = dict(metadata or {})
        self.created = time.time()
        self.trajectories: list[Trajectory] = []
        self.calls: list[dict[str, Any]] = []
        self.reward: float | None = None
        self.reward_source: str | None = None
        self.answer: str | None = None
        self.counts = {"calls": 0, "extend": 0, "fork": 0, "edit": 0, "new": 0, "choice": 0}
        self.in_flight = 0
        self.closed = False
        #: The conversation the latest call continued (its first choice): where the agent's answer came from.
        self.last_trajectory: int | None = None
        #: Stored Responses API responses: id -> their messages (input and output), the latest ``MAX_STORED``.
        self.responses: dict[str, list[Message]] = {}

    def store_response(self, response_id: str, messages: list[Message]) -> None:
        self.responses[response_id] = messages
        if len(self.responses) > MAX_STORED:
            del self.responses[next(iter(self.responses))]

    def stored_response(self, response_id: str) -> list[Message]:
        """The messages of a stored response (what ``previous_response_id`` continues), or a 404."""
        found = self.responses.get(response_id)
        if found is None:
            raise WireError(404, f"no stored response {response_id[:80]!r} in session {self.id!r} (responses are "
                                 "kept per session, the latest 1024, unless store is false)",
                            param="previous_response_id", code="response_not_found")
        return list(found)

    # -- planning (no side effects) -------------------------------------------------------------
    def plan(self, request: ChatRequest) -> Plan:
        keys = [m.key() for m in request.messages]
        tools_key = request.tools_key()
        best, best_turns, best_common = None, 0, 0
        for traj in self.trajectories:
            common = _common_prefix(traj.wire, keys)
            if traj.tools_key == tools_key and common == len(traj.wire):
                return self._extend(request, traj, keys)
            turns = sum(1 for g in traj.generated if g < common)
            if (turns, common) > (best_turns, best_common):
                best, best_turns, best_common = traj, turns, common
        if best is None:
            return self._fresh(request, "new", tools_key)
        edited = best_common < len(best.wire) and best_common < len(keys) and best_common in best.generated
        if best.tools_key != tools_key and best_turns:
            plan = self._fresh(request, "edit", tools_key)
            plan.drift = self._drift(best, best_common, "tools", plan.prompt_ids)
        elif best_turns == 0 or best.tools_key != tools_key:
            plan = self._fresh(request, "edit" if edited else "new", tools_key)
            if edited:
                plan.drift = self._drift(best, best_common, "edited", plan.prompt_ids)
        else:
            kept = best.generated[best_turns - 1] + 1
            plan = self._from(request, best, best_turns, keys, kept, "edit" if edited else "fork")
            if edited:
                plan.drift = self._drift(best, best_common, "edited", plan.prompt_ids)
        return plan

    def _extend(self, request: ChatRequest, traj: Trajectory, keys: list[tuple[Any, ...]]) -> Plan:
        return self._from(request, traj, traj.turns, keys, len(traj.wire), "extend", fork=False)

    def _from(self, request: ChatRequest, traj: Trajectory, turns: int, keys: list[tuple[Any, ...]], kept: int,
              kind: str, fork: bool = True) -> Plan:
        new = request.messages[kept:]
        rendered = template_messages(self.format, new, calls_by_id(request.messages))
        base = traj.fork(-1, kind, turns) if fork else traj
        env = base.environment(rendered)
        return Plan(kind, base.ids() + env.ids, request.tools_key(), base=base, base_turns=turns, env=env,
                    new_keys=keys[kept:], new_messages=[m.to_dict() for m in new])

    def _fresh(self, request: ChatRequest, kind: str, tools_key: str) -> Plan:
        rendered = template_messages(self.format, request.messages, calls_by_id(request.messages))
        template_kwargs: dict[str, Any] = {}
        if request.tools:
            prompt = self.format.prompt(rendered, [WireTool(t) for t in request.tools], self.tokenizer)
            rendered, template_kwargs = prompt.messages, dict(prompt.template_kwargs)
        start = Start.render(self.tokenizer, rendered, template_kwargs)
        return Plan(kind, list(start.ids), tools_key, start=start, new_keys=[m.key() for m in request.messages],
                    new_messages=[m.to_dict() for m in request.messages])

    @staticmethod
    def _drift(traj: Trajectory, common: int, kind: str, prompt_ids: list[int]) -> dict[str, Any]:
        """Where the request parts from conversation ``traj``: at message ``common``, at token ``position`` (the
        first where the new prompt differs from the old ids), leaving ``dropped_tokens`` of them behind."""
        old = traj.ids()
        position = _common_prefix(old, prompt_ids)
        return {"kind": kind, "trajectory": traj.index, "message": common, "position": position,
                "dropped_tokens": len(old) - position}

    # -- committing (after generation) ------------------------------------------------------------
    def commit(self, plan: Plan, results: list[GenerationResult], request: ChatRequest,
               tag: str | None = None, stops: tuple[str, ...] = (), constraint: Any = None) -> list[Choice]:
        """Record a generated call (``tag``: the client's name for it, if any; ``stops``: the stop strings it was
        generated with, cut from the content; ``constraint``: the grammar it was decoded under, recorded): each choice
        continues its own conversation. Returns the choices."""
        base = self._base(plan)
        if plan.drift is not None:
            base.drift = dict(plan.drift)
        copies = [base.copy(-1, "choice") for _ in results[1:]]
        choices = []
        for i, (traj, result) in enumerate(zip([base, *copies], results)):
            if plan.env is not None:
                traj.add_environment(plan.env, list(plan.new_keys))
            else:  # a fresh conversation: the request's messages are its prompt
                traj.wire = list(plan.new_keys)
            traj.add_model_turn(result)
            if tag is not None and tag not in traj.tags:
                traj.tags.append(tag)
            choice = self._choice(i, traj, result, request, stops or request.stop)
            traj.set_turn_key(Message("assistant", choice.content or "", tool_calls=choice.tool_calls).key())
            if traj.index < 0:
                traj.index = len(self.trajectories)
                self.trajectories.append(traj)
            choice.trajectory = traj.index
            choices.append(choice)
        self.last_trajectory = choices[0].trajectory
        self.counts["calls"] += 1
        self.counts[plan.kind] += 1
        self.counts["choice"] += len(copies)
        self._record(plan, choices, tag, constraint)
        return choices

    def _base(self, plan: Plan) -> Trajectory:
        if plan.kind == "extend":
            assert plan.base is not None
            if plan.base.turns == plan.base_turns:
                return plan.base
            # another request extended it meanwhile: this one continues a fork of what it saw
            plan.kind = "fork"
            return plan.base.fork(-1, "fork", plan.base_turns)
        if plan.base is not None:
            return plan.base
        assert plan.start is not None
        return Trajectory.begin(-1, plan.kind, plan.tools_key, plan.start, self.tokenizer)

    def _choice(self, index: int, traj: Trajectory, result: GenerationResult, request: ChatRequest,
                stops: tuple[str, ...]) -> Choice:
        turn = traj.conv.turns[-1]
        content_ids = result.output_ids[:len(result.output_ids) - int(turn.closed_by_model)]
        raw = decode_keep_special(self.tokenizer, content_ids)
        if request.tool_choice == "none" or not request.tools:
            content, calls = turn.text, list[ToolCallSpec]()
        else:
            content, calls = split_tool_calls(self.format, raw)
            if calls:
                content = _strip_specials(self.tokenizer, content)
            else:
                content = turn.text
        finish = result.finish_reason
        stopped = None
        if stops and not calls:
            content, stopped = cut_at_stop(content, stops)
            if stopped is not None:
                finish = "stop"
        if finish == "stop" and calls:
            finish = "tool_calls"
        return Choice(index, result, content if content or not calls else None, calls, finish, traj.index,
                      stopped)

    def _record(self, plan: Plan, choices: list[Choice], tag: str | None, constraint: Any) -> None:
        prompt_len = len(plan.prompt_ids)
        self.calls.append({
            "index": len(self.calls), "kind": plan.kind, "time": time.time(), "prompt_len": prompt_len, "tag": tag,
            "new_messages": plan.new_messages, "drift": plan.drift,
            "constraint": None if constraint is None else {"kind": constraint.kind, "spec": constraint.spec,
                                                           "reason": constraint.reason},
            "choices": [{"trajectory": c.trajectory, "output_ids": c.result.output_ids,
                         "logprobs": c.result.logprobs, "versions": c.result.token_versions(),
                         "finish_reason": c.finish_reason, "message": c.message()} for c in choices],
        })

    # -- reading -------------------------------------------------------------------------------------
    @property
    def drift_count(self) -> int:
        return self.counts["edit"]

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "calls": self.counts["calls"],
                "trajectories": len(self.trajectories), "splits": {k: self.counts[k] for k in ("fork", "edit")},
                "drift": self.drift_count, "reward": self.reward, "reward_source": self.reward_source,
                "answer": self.answer, "metadata": self.metadata, "closed": self.closed}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "calls_log": self.calls, "trajectories_log": [t.to_dict() for t in self.trajectories]}


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(``text`` up to the first stop string in it, that stop string) or (``text``, None): OpenAI's stop semantics
    (the stop string is not part of the content), whatever the engine left in its text."""
    found = [(text.find(stop), stop) for stop in stops if stop and stop in text]
    if not found:
        return text, None
    at, stop = min(found)
    return text[:at], stop


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _strip_specials(tokenizer: Any, text: str) -> str:
    for special in getattr(tokenizer, "all_special_tokens", None) or ():
        if special:
            text = text.replace(special, "")
    return text.strip()


