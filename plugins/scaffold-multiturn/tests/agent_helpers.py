"""Helpers shared by the agent controller's tests: small tools, a recording engine, scripted tool calls."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from mt_helpers import TokenizerScriptedEngine
from mt_helpers import registry as mt_registry
from scaffold_testkit import ScriptedEngine

from scaffold_core import hookimpl
from scaffold_core.chat_template import render_text
from scaffold_core.generation import GenerationRequest, GenerationResult
from scaffold_core.tokenizers import encode
from scaffold_core.tool import Tool, ToolCallError, ToolContext, ToolResult
from scaffold_multiturn.tool_formats import HermesFormat


class AddTool(Tool):
    name = "add"
    description = "Add two numbers."
    parameters = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                  "required": ["a", "b"], "additionalProperties": False}

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(str(arguments["a"] + arguments["b"]))


class SleepTool(Tool):
    """Sleeps; records when each call ran in the episode's state (``sleeps``: (start, end) pairs)."""

    name = "sleep"
    description = "Wait for some seconds."
    parameters = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}

    def __init__(self, timeout: float = 0.5):
        self.timeout = timeout

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        start = time.perf_counter()
        try:
            await asyncio.sleep(arguments["seconds"])
        finally:
            context.state.setdefault("sleeps", []).append((start, time.perf_counter()))
        return ToolResult(f"slept {arguments['seconds']} s")


class NotesTool(Tool):
    """A stateful tool: ``write`` keeps a note in the episode's state, ``read`` returns them all (with a delay)."""

    name = "notes"
    description = "Write a note, or read back every note written so far."
    parameters = {"type": "object", "properties": {"action": {"enum": ["write", "read"]}, "text": {"type": "string"}},
                  "required": ["action"]}

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        if self.delay:
            await asyncio.sleep(self.delay * (hash(context.call_id) % 7) / 7)
        notes = context.state.setdefault("notes", [])
        if arguments["action"] == "write":
            if "text" not in arguments:
                raise ToolCallError("write needs a text", kind="bad_arguments")
            notes.append(arguments["text"])
            return ToolResult("noted")
        return ToolResult("|".join(notes))


class TestTools:
    """A plugin registering the test tools."""

    @hookimpl
    def register_tools(self, registry):
        registry.add("add", AddTool)
        registry.add("sleep", SleepTool)
        registry.add("notes", NotesTool)


def registry(*extra: Any) -> Any:
    """Built-ins, scaffold-multiturn, scaffold-gsm8k and the test tools (and ``extra`` plugins)."""
    return mt_registry(TestTools(), *extra)


def agent(reg: Any = None, **options: Any) -> Any:
    options.setdefault("tools", ["add"])
    return (reg or registry()).create("controller", "agent", options, path="controller")


def call(name: str, **arguments: Any) -> str:
    """A Hermes-style tool call as a model writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def turn_of(prompt: str) -> int:
    """The (0-based) model turn a ByteTokenizer prompt asks for."""
    return prompt.count("<|assistant|>") - 1


def last_user(prompt: str) -> str:
    """The content of the last user message of a ByteTokenizer prompt (the tool results, or the question)."""
    body = prompt[:prompt.rfind("<|assistant|>")]
    return body[body.rfind("<|user|>\n") + len("<|user|>\n"):].removesuffix("<|end|>\n")


class Recording:
    """Keeps every (request, result); each result's weight_version counts the requests before it."""

    results: list[tuple[GenerationRequest, GenerationResult]]

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)  # type: ignore[misc]
        result.weight_version = len(self.results)
        self.results.append((request, result))
        return result


class RecordingEngine(Recording, ScriptedEngine):
    """A recording :class:`ScriptedEngine` (the core ByteTokenizer)."""

    def __init__(self, respond: Any, **options: Any):
        super().__init__(respond, **options)
        self.results = []


class RecordingTokenizerEngine(Recording, TokenizerScriptedEngine):
    """A recording scripted engine speaking through a real tokenizer (SmolLM2's): no model, exact ids."""

    def __init__(self, tokenizer: Any, respond: Any, **options: Any):
        super().__init__(tokenizer, respond, **options)
        self.results = []


def check_token_by_token(result: Any, engine: Any, tools: Any = None, fmt: Any = None, task: Any = None) -> None:
    """The sequence is the prompt, the engine's own ids on each model turn and the rendered results between them.

    ``task`` gives the episode's prompt messages (default: the row's question as one user message).
    """
    tok = engine.tokenizer
    sample, traj = result.samples[0], result.trajectories[0]
    assert traj.input_ids == sample.prompt_ids + sample.output_ids
    mine = [r for q, r in engine.results if q.episode_id == result.episode_id]
    turns = sample.metadata["turns"]
    assert len(turns) == len(mine)
    expected_mask = [0] * len(traj.input_ids)
    for turn, generated in zip(turns, mine):
        start, end = turn["start"], turn["end"]
        assert traj.input_ids[start:end] == generated.output_ids  # the engine's ids, untouched
        assert traj.logprobs[start:end] == generated.logprobs
        assert traj.versions[start:end] == [generated.weight_version] * (end - start)
        expected_mask[start:end] = [1] * (end - start)
    assert traj.loss_mask == expected_mask
    for i, trained in enumerate(expected_mask):
        if not trained:
            assert traj.logprobs[i] == 0.0 and traj.versions[i] == -1
    # Drift 0: the ids are a fresh render of the whole conversation, tokenized at once.
    fmt = fmt or HermesFormat()
    asked = task.messages(result.row) if task is not None else [{"role": "user", "content": result.row["question"]}]
    prompt = fmt.prompt(asked, list(tools or [AddTool()]), tok)
    messages = [*prompt.messages, *sample.metadata["messages"]]
    fresh = encode(tok, render_text(tok, messages, add_generation_prompt=False, template_kwargs=prompt.template_kwargs))
    assert fresh[:len(traj.input_ids)] == traj.input_ids
    assert result.metrics["drift"] == 0.0
