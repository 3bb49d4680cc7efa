"""One conversation's token sequence, built token-in, token-out, and its drift check.

The sequence is the exact concatenation of the chat-template prompt, each
model turn's sampled ids (loss mask 1, the engine's logprobs and the weight
version of each token) and the template-rendered environment turns between
them (loss mask 0, logprob 0.0, version -1).
Model output is never decoded and re-encoded: it is decoded only to give the
environment something to read and to record the conversation's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .chat_template import (
    SENTINEL,
    boundary,
    covered_prefix,
    decode_keep_special,
    decode_plain,
    render_text,
    tail_tokens,
)
from .generation import GenerationResult
from .tokenizers import encode


@dataclass(slots=True)
class Turn:
    """One model turn: its sampled ids sit at ``output_ids[start:end]`` of the conversation."""

    index: int
    start: int
    end: int
    finish_reason: str
    weight_version: Any
    text: str
    #: The turn ended with the template's end-of-turn token (not cut by max_tokens).
    closed_by_model: bool

    def to_dict(self, prompt_len: int) -> dict[str, Any]:
        """Positions in the training sequence (``input_ids``), not in the output."""
        return {"index": self.index, "start": prompt_len + self.start, "end": prompt_len + self.end,
                "finish_reason": self.finish_reason, "weight_version": self.weight_version}


@dataclass(slots=True)
class DriftReport:
    """The conversation's ids compared with a fresh render of the whole conversation.

    Two questions, answered separately:

    * **Drift** (``kind``): does the template side of the sequence (prompt,
      turn ends, environment turns, assistant headers) differ from a fresh
      render? ``"template"``: the rendered *text* differs (the template is
      not append-only: it rewrites or drops earlier turns, trims content,
      ...). ``"boundary"``: same text, but tokenizing the whole render at
      once gives other ids than tokenizing turn by turn (text merging across
      a turn boundary). ``None``: no drift. ``position`` is the first
      differing index (of the canonical sequence, see below) and ``turn``
      the model turn it falls in or after (``-1``: in the prompt).
    * **Re-tokenization mismatch** (``noncanonical_turns``): model turns whose
      sampled ids are not the tokenizer's own encoding of their text (a model
      may sample ``####`` ``####`` where the tokenizer writes ``########``).
      The trajectory keeps the sampled ids, so this is harmless here; it is
      exactly what a trainer that re-tokenizes text would get wrong.

    The drift comparison uses the *canonical* sequence: the accumulated ids
    with each model turn re-encoded from its text, so that the model's own
    token choices are not counted as template drift.
    """

    kind: str | None
    position: int = -1
    turn: int = -1
    expected_len: int = 0
    actual_len: int = 0
    noncanonical_turns: list[int] = field(default_factory=list)
    prefix_changed_turns: list[int] = field(default_factory=list)

    @property
    def drift(self) -> bool:
        return self.kind is not None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "position": self.position, "turn": self.turn, "expected_len": self.expected_len,
                "actual_len": self.actual_len, "noncanonical_turns": list(self.noncanonical_turns),
                "prefix_changed_turns": list(self.prefix_changed_turns)}


class Conversation:
    """The growing token sequence and messages of one conversation (one per episode, never shared)."""

    def __init__(self, tokenizer: Any, messages: Sequence[dict[str, Any]], prompt_ids: Sequence[int],
                 prompt_text: str = "", template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        #: Keyword arguments of every chat-template render of this conversation (e.g. ``tools=``).
        self.template_kwargs = dict(template_kwargs or {})
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.output_mask: list[int] = []
        self.output_versions: list[int] = []
        self.turns: list[Turn] = []
        # The text the accumulated ids stand for; equals a fresh render while the template is append-only.
        self.text = prompt_text or render_text(tokenizer, self.messages, add_generation_prompt=True,
                                               template_kwargs=self.template_kwargs)
        self.prefix_changed_turns: list[int] = []
        self._covered = 0  # characters of the template's turn end the last model turn produced
        # (model turn index, or None for an environment turn; its text; its ids) after the prompt
        self._pieces: list[tuple[int | None, str, list[int]]] = []

    @property
    def ids(self) -> list[int]:
        """The whole sequence so far: the model's next prompt."""
        return self.prompt_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    # -- building ----------------------------------------------------------
    def add_model_turn(self, result: GenerationResult) -> Turn:
        """Append a model turn's sampled ids (mask 1, logprobs and versions as sampled) and record its message."""
        ids = list(result.output_ids)
        end = boundary(self.tokenizer, [*self.messages, {"role": "assistant", "content": SENTINEL}], [],
                       add_generation_prompt=False, template_kwargs=self.template_kwargs)
        if end.before != self.text:
            self.prefix_changed_turns.append(len(self.turns))
        covered = covered_prefix(self.tokenizer, ids, end.after)
        content_ids = ids[:-1] if covered else ids
        content = decode_keep_special(self.tokenizer, content_ids)
        turn = Turn(index=len(self.turns), start=len(self.output_ids), end=len(self.output_ids) + len(ids),
                    finish_reason=result.finish_reason, weight_version=result.weight_version,
                    text=decode_plain(self.tokenizer, content_ids), closed_by_model=bool(covered))
        self.output_ids += ids
        self.output_logprobs += list(result.logprobs)
        self.output_mask += [1] * len(ids)
        self.output_versions += result.token_versions()
        self.messages.append({"role": "assistant", "content": content})
        self.text += content + end.after[:covered]
        self._pieces.append((turn.index, content + end.after[:covered], ids))
        self._covered = covered
        self.turns.append(turn)
        return turn

    def environment_tokens(self, messages: Sequence[dict[str, Any]]) -> tuple[list[int], str]:
        """The ids (and text) that close the last model turn, render ``messages`` and open the next turn."""
        if not self.turns:
            raise ValueError("internal: environment messages before any model turn")
        history = [*self.messages[:-1], {"role": "assistant", "content": SENTINEL}]
        after = boundary(self.tokenizer, history, list(messages), add_generation_prompt=True,
                         template_kwargs=self.template_kwargs).after
        covered = covered_prefix(self.tokenizer, self.output_ids[self.turns[-1].start:self.turns[-1].end], after)
        rest = after[covered:]
        return tail_tokens(self.tokenizer, rest), rest

    def add_environment(self, messages: Sequence[dict[str, Any]], ids: list[int], text: str) -> None:
        """Append an environment turn (mask 0, logprob 0.0, version -1) computed by :meth:`environment_tokens`."""
        self.output_ids += ids
        self.output_logprobs += [0.0] * len(ids)
        self.output_mask += [0] * len(ids)
        self.output_versions += [-1] * len(ids)
        self.messages += [dict(m) for m in messages]
        self.text += text
        self._pieces.append((None, text, list(ids)))

    def closing_tokens(self) -> tuple[list[int], str]:
        """The ids (and text) a fresh render puts after the last model turn, not yet in the sequence."""
        if not self.turns:
            return [], ""
        history = [*self.messages[:-1], {"role": "assistant", "content": SENTINEL}]
        rest = boundary(self.tokenizer, history, [], add_generation_prompt=False,
                        template_kwargs=self.template_kwargs).after[self._covered:]
        return tail_tokens(self.tokenizer, rest), rest

    # -- checking ----------------------------------------------------------
    def drift(self) -> DriftReport:
        """Compare the accumulated ids (plus the last turn's end) with a fresh render of the whole conversation."""
        closing, closing_text = self.closing_tokens()
        fresh_text = render_text(self.tokenizer, self.messages, add_generation_prompt=False,
                                 template_kwargs=self.template_kwargs)
        expected = encode(self.tokenizer, fresh_text)
        canonical = list(self.prompt_ids)
        starts: list[tuple[int, int]] = []  # (position in canonical, model turn index)
        noncanonical = []
        for index, text, ids in self._pieces:
            if index is not None:
                starts.append((len(canonical), index))
                ids_of_text = encode(self.tokenizer, text)
                if ids_of_text != ids:
                    noncanonical.append(index)
                ids = ids_of_text
            canonical += ids
        canonical += closing
        report = DriftReport(None, expected_len=len(expected), actual_len=len(self) + len(closing),
                             noncanonical_turns=noncanonical, prefix_changed_turns=list(self.prefix_changed_turns))
        if canonical == expected and self.text + closing_text == fresh_text:
            return report
        report.kind = "boundary" if self.text + closing_text == fresh_text else "template"
        report.position = next((i for i, (a, b) in enumerate(zip(canonical, expected)) if a != b),
                               min(len(canonical), len(expected)))
        report.turn = max((index for at, index in starts if at <= report.position), default=-1)
        return report
