"""scaffold-multiturn against scaffold's conformance kit: controllers and trajectory maker keep their contracts."""

from __future__ import annotations

from mt_helpers import registry
from scaffold_testkit.conformance import ControllerConformance, TrajectoryMakerConformance
from scaffold_testkit.conformance.trajectories import example_episodes

import scaffold_multiturn


class _WithGSM8K:
    """Build components through a registry that also holds scaffold-gsm8k (the task and verifier they use)."""

    def scaffold_registry(self):
        return registry()


class TestMultiTurnChatConformance(_WithGSM8K, ControllerConformance):
    """Conversations of up to 3 turns with the verifier_feedback environment (wrong answers are retried)."""

    plugin = scaffold_multiturn
    name = "multiturn_chat"
    options = {"environment": "verifier_feedback", "max_turns": 3, "turn_discount": 0.5}


class TestMultiTurnChatSeveralConversationsConformance(TestMultiTurnChatConformance):
    options = {"environment": {"name": "verifier_feedback", "wrong_message": "No: {answer} is wrong."},
               "max_turns": 2, "samples": 3}


def multiturn_episode():
    """A real multi-turn episode (two model turns, an environment turn between) from the controller."""
    from mt_helpers import controller, run
    from scaffold_testkit import ListTask, ScriptedEngine

    def respond(prompt, request):
        return "5" if prompt.count("<|assistant|>") == 2 else "6"

    rows = [{"id": "mt", "question": "What is 2 + 3?", "answer": "5"}]
    return run(ListTask(rows), ScriptedEngine(respond), controller(max_turns=3, turn_discount=0.5))[0]


class TestMultiTurnTrajectoryMakerConformance(_WithGSM8K, TrajectoryMakerConformance):
    plugin = scaffold_multiturn
    name = "multiturn"

    def make_episodes(self):
        return [*example_episodes(), multiturn_episode()]


class TestMultiTurnGRPOTrajectoryMakerConformance(TestMultiTurnTrajectoryMakerConformance):
    options = {"advantage": "grpo", "std": "none"}


class TestAgentConformance(ControllerConformance):
    """The agent calls the `add` tool on the question's numbers, then answers (right for two seeds in three)."""

    plugin = scaffold_multiturn
    name = "agent"
    options = {"tools": ["add"], "max_turns": 3}

    def scaffold_registry(self):
        from agent_helpers import registry as agent_registry

        return agent_registry()

    def respond(self, prompt, request):
        import re

        from agent_helpers import call, turn_of
        from scaffold_testkit.conformance.controllers import right_or_wrong

        if turn_of(prompt) == 0:
            a, b = map(int, re.findall(r"(\d+) \+ (\d+)", prompt)[-1])
            return call("add", a=a, b=b)
        return right_or_wrong(prompt, request)


class TestAgentSeveralSamplesConformance(TestAgentConformance):
    options = {"tools": ["add", "notes"], "max_turns": 2, "samples": 3, "format": {"name": "hermes"}}
