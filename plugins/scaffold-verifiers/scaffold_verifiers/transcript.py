"""A verifiers task's prompt as chat messages, and a one-turn transcript as the library records one.

The prompt is built as the library's tool-less chat harness (``null``) builds it: the task's
``system_prompt`` as a system message, then the prompt (a string becomes one user message; a list of
messages, few-shot turns included, is taken as it is). The transcript is the library's own record of a
model call (``graph.prepare_turn(...).commit(response)``, what its interception does), so the task's
scoring sees exactly what it would see after a run of its own harness.
"""

from __future__ import annotations

import time
from typing import Any

from scaffold_core.errors import DataError


def prompt_messages(data: Any) -> list[dict[str, str]]:
    """The chat messages (``{role, content}`` dicts) of a task's data."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    prompt = data.prompt
    if prompt is None:
        raise DataError(f"verifiers task {data.idx} has no prompt (the user opens the conversation): a "
                        "single-turn run needs a prompt")
    if isinstance(prompt, str):
        return [*messages, {"role": "user", "content": prompt}]
    for message in prompt:
        if getattr(message, "role", None) == "tool" or getattr(message, "tool_calls", None):
            raise DataError(f"verifiers task {data.idx}: its prompt holds tool calls or results, which a "
                            "single-turn run does not show the model")
        messages.append({"role": message.role, "content": _text(message.content, data.idx)})
    return messages


def rollout_messages(data: Any) -> list[dict[str, str]]:
    """The task's opening as text chat messages, for display and the episode's prompt record only: the library's
    rollout builds the model's real prompts itself (its harness, tools and user turns)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    prompt = data.prompt
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt:
        for message in prompt:
            role = message.role if message.role in ("system", "user", "assistant") else "user"
            content = message.content
            text = content if isinstance(content, str) else "".join(
                getattr(part, "text", "") for part in content or ())
            messages.append({"role": role, "content": text})
    return messages or [{"role": "user", "content": ""}]


def _text(content: Any, idx: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if getattr(part, "type", None) != "text":
            raise DataError(f"verifiers task {idx}: its prompt holds {getattr(part, 'type', 'non-text')} content; "
                            "scaffold's engines take text")
        parts.append(part.text)
    return "".join(parts)


def one_turn_trace(task: Any, messages: list[dict[str, str]], completion: str, *,
                   finish_reason: str = "stop") -> Any:
    """The library's ``Trace`` of one model call: ``messages`` in, ``completion`` out."""
    from verifiers.v1 import AgentConfig, AssistantMessage, Response, Trace
    from verifiers.v1.graph import prepare_turn
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, ModelCall, TraceTask
    from verifiers.v1.types import SystemMessage, UserMessage

    kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
    prompt = [kinds[m["role"]](content=m["content"]) for m in messages]
    trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                  agent=AgentInfo(config=AgentConfig()), state=state_cls(type(task))())
    response = Response(id="scaffold", created=int(time.time()), model="scaffold",
                        message=AssistantMessage(content=completion),
                        finish_reason=finish_reason if finish_reason in ("stop", "length") else "stop")
    node = prepare_turn(trace, prompt).commit(response)
    trace.calls.append(ModelCall(node=node, model="scaffold", finish_reason=response.finish_reason))
    trace.is_completed = True
    trace.ok = True
    trace.stop("agent_completed")
    return trace
