"""The task contract: a dataset loader, a prompt builder and defaults.

A task plugin subclasses :class:`Task` (or provides the same methods):

* ``load()`` yields rows (dicts). A row's ``"id"`` names its episode (the
  row's position is used when absent). Rows that cannot be used are skipped
  and counted in ``self.skipped`` (reason -> count), not fatal.
* ``messages(row)`` returns the chat messages of the prompt; the runtime
  renders them with the engine tokenizer's chat template. Override
  ``build_prompt`` for prompts that are not chats.
* ``reference(row)`` returns the gold answer the verifier compares against:
  any JSON value (a string, a number, a list of acceptable answers, a dict
  the task's verifier understands), or ``None``.
* ``default_config`` supplies defaults for the ``sampling``, ``verifier`` and
  ``controller`` sections; the user's explicit config always wins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from .episode import EpisodeContext
from .sampling import SamplingParams, derive_seed
from .tokenizers import render_chat
from .verifier import Reference


@dataclass(slots=True)
class Prompt:
    text: str
    ids: list[int]
    messages: list[dict[str, Any]] | None = None


class Task:
    """Base class of tasks."""

    #: Defaults for other config sections, e.g. ``{"sampling": {"max_tokens": 512},
    #: "verifier": {"name": "gsm8k"}}``.
    default_config: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()

    def load(self) -> Iterable[dict[str, Any]]:  # pragma: no cover - interface
        raise NotImplementedError

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:  # pragma: no cover - interface
        raise NotImplementedError

    def reference(self, row: dict[str, Any]) -> Reference:
        """The gold answer: any JSON value (see :data:`scaffold_core.verifier.Reference`), ``None`` for none."""
        return row.get("reference")

    def build_prompt(self, row: dict[str, Any], tokenizer: Any) -> Prompt:
        messages = self.messages(row)
        text, ids = render_chat(tokenizer, messages)
        return Prompt(text=text, ids=ids, messages=messages)


def episode_id_of(row: dict[str, Any], index: int) -> str:
    """A row's episode id: its ``"id"``, else its position in the task's rows."""
    return str(row.get("id", index))


def episode_context(task: Any, index: int, row: dict[str, Any], tokenizer: Any,
                    sampling: SamplingParams) -> EpisodeContext:
    """The explicit context of the episode for ``row``: prompt built with ``tokenizer``, seed from the id.

    Raises whatever ``task.build_prompt`` raises for an unusable row.
    """
    episode_id = episode_id_of(row, index)
    prompt = task.build_prompt(row, tokenizer)
    return EpisodeContext(
        episode_id=episode_id, index=index, row=row, prompt_ids=prompt.ids, sampling=sampling,
        seed=derive_seed(sampling.seed, episode_id), reference=task.reference(row), prompt_text=prompt.text,
        messages=prompt.messages, tokenizer=tokenizer,
    )
