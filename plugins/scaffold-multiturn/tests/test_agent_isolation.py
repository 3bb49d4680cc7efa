"""Agent episodes share no state: 1,000 concurrent episodes (and branches) with a stateful tool, random delays,
and a subclass that keeps its own mutable state on ``self`` without overriding ``clone``."""

from __future__ import annotations

import re

from agent_helpers import call, last_user, registry, turn_of
from mt_helpers import run
from scaffold_testkit import ListTask, ScriptedEngine

from scaffold_core import hookimpl
from scaffold_gsm8k.verifier import GSM8KVerifier
from scaffold_multiturn.agent import AgentController

EPISODES = 1000
SHORT_FORMAT = {"name": "hermes", "tools_prompt": "Tools:\n{tools}"}


class Remembering(AgentController):
    """A third-party agent that keeps what it saw on ``self`` (and does not override ``clone``)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.seen: list[str] = []

    def run_agent(self, ctx):
        self.seen.append(f"{ctx.episode_id}/{ctx.sample_base}")
        sample, metrics = yield from super().run_agent(ctx)
        self.seen.append(sample.text)
        metrics["seen"] = float(len(self.seen))
        metrics["mine"] = float(all(ctx.episode_id in s or s.startswith("#### ") for s in self.seen))
        return sample, metrics


class RememberingPlugin:
    @hookimpl
    def register_controllers(self, registry):
        registry.add("remembering_agent", Remembering)


def secret_of(prompt: str) -> str:
    return re.search(r"secret (\w+)", prompt).group(1)


def respond(prompt: str, request) -> str:
    """Write the episode's secret (and its branch) in a note, read the notes back, answer with what was read."""
    turn = turn_of(prompt)
    branch = request.request_id.split("/")[2]
    if turn == 0:
        return "Noting it. " + call("notes", action="write", text=f"{secret_of(prompt)}-{branch}")
    if turn == 1:
        return call("notes", action="read")
    return "#### " + last_user(prompt).removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")


def rows(n: int) -> list[dict]:
    return [{"id": f"e{i}", "question": f"Remember the secret {i * 7919 % 100003}.", "answer": str(i * 7919 % 100003)}
            for i in range(n)]


def test_a_thousand_concurrent_agent_episodes_share_no_state():
    reg = registry(RememberingPlugin())
    prototype = reg.create("controller", "remembering_agent",
                           {"tools": [{"name": "notes", "delay": 0.003}], "format": SHORT_FORMAT}, path="controller")
    tool = prototype.tools["notes"]
    engine = ScriptedEngine(respond, delay=(0.0, 0.003), seed=5)
    results = run(ListTask(rows(EPISODES)), engine, prototype, verifier=GSM8KVerifier(), max_tokens=128,
                  concurrency=EPISODES, timeout=600)
    assert len(results) == EPISODES
    for result, row in zip(results, rows(EPISODES)):
        assert result.ok, result.error
        sample = result.samples[0]
        assert sample.text == f"#### {row['answer']}-0", (row["id"], sample.text)  # its own note, and only it
        assert result.metrics["seen"] == 2.0 and result.metrics["mine"] == 1.0
        assert result.metrics["tool_calls"] == 2.0 and result.metrics["tool_errors"] == 0.0
        assert sum(result.trajectories[0].loss_mask) == sum(sample.output_mask)
    assert prototype.seen == [] and prototype.tools["notes"] is tool  # the prototype is untouched; tools shared


def test_branches_of_a_vote_share_no_tool_state():
    reg = registry(RememberingPlugin())
    generator = {"name": "remembering_agent", "tools": [{"name": "notes", "delay": 0.003}], "format": SHORT_FORMAT}
    prototype = reg.create("controller", "majority_vote", {"samples": 4, "generator": generator}, path="controller")
    engine = ScriptedEngine(respond, delay=(0.0, 0.003), seed=9)
    n = EPISODES // 4
    results = run(ListTask(rows(n)), engine, prototype, verifier=GSM8KVerifier(), max_tokens=128, concurrency=n,
                  timeout=600)
    for result, row in zip(results, rows(n)):
        assert result.ok, result.error
        texts = sorted((s.sample_index, s.text) for s in result.samples)
        assert texts == [(i, f"#### {row['answer']}-{i}") for i in range(4)], (row["id"], texts)
    assert prototype.generator.seen == []
