"""One token-faithful conversation of a session: the ids the server produced, and the client messages they stand for.

The token side is scaffold-multiturn's :class:`~scaffold_core.conversation.Conversation`
(the chat-template prompt, each model turn's sampled ids with their logprobs, the
rendered environment turns between them, mask 1 for sampled ids and 0 for the rest).
This module adds what a server needs on top: the client's view of the same history
(one :meth:`~scaffold_serve.wire.Message.key` per message, so a later request can be
matched against it), per-token weight versions, and forks (a copy that keeps the
first ``t`` model turns, rebuilt by replaying the recorded steps, never by
re-tokenizing).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from scaffold_core.chat_template import render_text
from scaffold_core.conversation import Conversation
from scaffold_core.episode import Sample
from scaffold_core.generation import GenerationResult
from scaffold_core.tokenizers import encode


@dataclass(slots=True)
class Start:
    """A conversation's first prompt: its template messages, chat-template arguments, text and ids."""

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any]
    text: str
    ids: list[int]

    @classmethod
    def render(cls, tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> Start:
        text = render_text(tokenizer, messages, add_generation_prompt=True, template_kwargs=template_kwargs)
        return cls(messages, template_kwargs, text, encode(tokenizer, text))


@dataclass(slots=True)
class EnvStep:
    """Environment tokens (tool results, user messages) appended after a model turn."""

    messages: list[dict[str, Any]]
    ids: list[int]
    text: str


@dataclass(eq=False)
class Trajectory:
    """A conversation of one session (see the module docstring). ``origin`` says how it began:
    ``new`` (a fresh render), ``fork`` (a copy of another up to a model turn), ``edit`` (a fork made
    because the client changed a message the model had written), ``choice`` (another of ``n`` choices)."""

    index: int
    origin: str
    tools_key: str
    start: Start
    conv: Conversation
    parent: int | None = None
    #: The client messages this conversation stands for (their keys), model turns included.
    wire: list[tuple[Any, ...]] = field(default_factory=list)
    #: Positions in ``wire`` of the model's own turns.
    generated: list[int] = field(default_factory=list)
    #: The weight version of each output token (-1 for environment tokens).
    steps: list[EnvStep | GenerationResult] = field(default_factory=list)
    drift: dict[str, Any] | None = None
    #: The tags of the calls that continued it (see ``ServeOptions.tag_header``), in order.
    tags: list[str] = field(default_factory=list)

    @classmethod
    def begin(cls, index: int, origin: str, tools_key: str, start: Start, tokenizer: Any,
              parent: int | None = None) -> Trajectory:
        conv = Conversation(tokenizer, start.messages, start.ids, start.text, template_kwargs=start.template_kwargs)
        return cls(index, origin, tools_key, start, conv, parent)

    @property
    def turns(self) -> int:
        return len(self.conv.turns)

    # -- growing (only ever by appending) ---------------------------------------------------
    def environment(self, messages: list[dict[str, Any]]) -> EnvStep:
        """The tokens that close the last model turn, render ``messages`` and open the next turn (not appended)."""
        ids, text = self.conv.environment_tokens(messages)
        return EnvStep(messages, ids, text)

    def add_environment(self, step: EnvStep, keys: list[tuple[Any, ...]]) -> None:
        self.conv.add_environment(step.messages, step.ids, step.text)
        self.steps.append(step)
        self.wire += keys

    def add_model_turn(self, result: GenerationResult) -> None:
        """Append a model turn's sampled ids; :meth:`set_turn_key` then records how the client sees it."""
        self.conv.add_model_turn(result)
        self.steps.append(result)

    def set_turn_key(self, key: tuple[Any, ...]) -> None:
        """The client's view of the model turn just added (known once its text is split into content and calls)."""
        self.generated.append(len(self.wire))
        self.wire.append(key)

    # -- copies --------------------------------------------------------------------------------
    def copy(self, index: int, origin: str) -> Trajectory:
        """An independent copy (the tokenizer is shared, everything else copied)."""
        memo = {id(self.conv.tokenizer): self.conv.tokenizer}
        twin = copy.deepcopy(self, memo)
        twin.index, twin.origin, twin.parent, twin.drift = index, origin, self.index, None
        return twin

    def fork(self, index: int, origin: str, turns: int) -> Trajectory:
        """A new conversation holding this one's first ``turns`` model turns and the environment between them,
        rebuilt by replaying the recorded steps (the ids are the same ids, never re-tokenized text)."""
        if turns == self.turns:
            return self.copy(index, origin)
        if turns < 1:
            raise ValueError("internal: a fork keeps at least one model turn")
        twin = Trajectory.begin(index, origin, self.tools_key, self.start, self.conv.tokenizer, parent=self.index)
        done = 0
        for step in self.steps:
            if isinstance(step, EnvStep):
                if done == turns:
                    break
                twin.conv.add_environment(step.messages, step.ids, step.text)
            else:
                if done == turns:
                    break
                twin.conv.add_model_turn(step)
                done += 1
            twin.steps.append(step)
        twin.generated = self.generated[:turns]
        twin.tags = list(self.tags)
        twin.wire = self.wire[:self.generated[turns - 1] + 1] if turns else []
        return twin

    # -- reading ---------------------------------------------------------------------------------
    def ids(self) -> list[int]:
        return self.conv.ids

    def to_dict(self) -> dict[str, Any]:
        conv = self.conv
        prompt_len = len(conv.prompt_ids)
        return {
            "index": self.index, "origin": self.origin, "parent": self.parent, "drift": self.drift,
            "tags": list(self.tags), "prompt_len": prompt_len, "input_ids": conv.ids,
            "loss_mask": [0] * prompt_len + list(conv.output_mask),
            "logprobs": [0.0] * prompt_len + list(conv.output_logprobs),
            "versions": [-1] * prompt_len + list(conv.output_versions),
            "turns": [t.to_dict(prompt_len) for t in conv.turns],
            "messages": conv.messages,
        }

    def sample(self, answer: str, verdict: Any, sample_index: int, metadata: dict[str, Any],
               rollout: int | None = None) -> Sample:
        """This conversation as one training :class:`~scaffold_core.episode.Sample` (model tokens mask 1); ``rollout``:
        the agent run it is a piece of (every conversation of one session shares it)."""
        conv = self.conv
        prompt_len = len(conv.prompt_ids)
        report = conv.drift()
        meta = {**metadata, "trajectory": self.index, "origin": self.origin, "parent": self.parent,
                **({"tags": list(self.tags)} if self.tags else {}),
                "turns": [t.to_dict(prompt_len) for t in conv.turns],
                "messages": conv.messages[len(self.start.messages):],
                "drift": self.drift, "template_drift": report.to_dict()}
        sample = Sample(prompt_ids=list(conv.prompt_ids), output_ids=list(conv.output_ids),
                        output_logprobs=list(conv.output_logprobs), output_mask=list(conv.output_mask), text=answer,
                        finish_reason=conv.turns[-1].finish_reason, sample_index=sample_index,
                        weight_version=conv.turns[0].weight_version, verdict=verdict, metadata=meta,
                        versions=list(conv.output_versions), rollout=rollout)
        return sample
