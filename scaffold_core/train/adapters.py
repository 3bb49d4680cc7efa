"""What adapters that run scaffold inside another trainer's rollout workers share (AReaL, verl, your own).

Such a trainer owns the dataset, the inference servers and the loop; the
adapter turns one of its rows into a scaffold episode with
:class:`~scaffold_core.train.prompt_groups.TrainingRollouts` (``manage_engine=False``)
over an engine adapter of the trainer's servers, and hands back the trainer's
own format. The pieces here are the trainer-neutral part of that:

* :func:`build_component`: a component from how the trainer's config names it
  (a registered name, ``{name: ..., options...}``, or an object);
* :func:`to_plain`: plain values from the trainer's config objects (OmegaConf,
  numpy), so that options compare, print and pickle;
* :class:`PromptTask`: a task whose row *is* the prompt (chat messages under
  one key, the gold answer under another, or ids the trainer already rendered);
* :func:`chosen_index`: the episode's answer among its samples, for trainers
  that take one trajectory per episode;
* :func:`~scaffold_core.tokenizers.response_text` (re-exported here): a
  response's text from its ids, for servers that return ids only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..episode import EpisodeResult
from ..task import Prompt, Task
from ..tokenizers import encode, render_chat
from ..tokenizers import response_text as response_text  # re-exported: adapters import it from here


def to_plain(value: Any) -> Any:
    """Plain dicts, lists and scalars from config objects (OmegaConf, numpy arrays and scalars)."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, Sequence):
        return [to_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return to_plain(value.tolist())
    return value


def is_object(spec: Any) -> bool:
    """Whether a component is given as an object (not a name, an options mapping or None)."""
    return spec is not None and not isinstance(spec, (str, Mapping))


def build_component(kind: str, spec: Any, *, path: str, registry: Any = None) -> Any:
    """A component from a registered name, ``{name: ..., options...}`` (a trainer's config object too), or an object
    used as it is (None: None): :meth:`~scaffold_core.plugins.registry.Registry.build` on plain values.

    ``kind`` is the registry's kind (``controller``, ``verifier``,
    ``trajectory_maker``, ``task``); ``path`` names the option in errors.
    """
    if spec is None:
        return None
    if registry is None:
        from ..plugins import get_registry

        registry = get_registry()
    return registry.build(kind, to_plain(spec) if isinstance(spec, Mapping) else spec, path=path)


def lookup(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, where a dotted key walks nested mappings (``reward_model.ground_truth``); None if absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


class PromptTask(Task):
    """A task whose row is the prompt: chat messages under ``messages_key``, the gold answer under ``reference_key``.

    Keys may be dotted paths into nested mappings. ``chat_template_kwargs``
    go to the tokenizer's chat template (``enable_thinking``, ...). A row
    holding ``prompt_ids`` (ids a trainer already rendered) uses them as they are.
    """

    def __init__(self, messages_key: str = "messages", reference_key: str | None = "answer",
                 chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__()
        self.messages_key = messages_key
        self.reference_key = reference_key
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def load(self) -> list[dict[str, Any]]:
        return []

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = to_plain(lookup(row, self.messages_key))
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(f"row[{self.messages_key!r}] must be a non-empty list of chat messages "
                             f"({{'role': ..., 'content': ...}}); got {type(messages).__name__}. Set messages_key "
                             f"to the field holding the prompt, or name a scaffold task that builds it")
        return messages

    def reference(self, row: dict[str, Any]) -> str | None:
        if self.reference_key is None:
            return None
        value = lookup(row, self.reference_key)
        return None if value is None else str(value)

    def build_prompt(self, row: dict[str, Any], tokenizer: Any) -> Prompt:
        messages = self.messages(row)
        ids = row.get("prompt_ids")
        if ids is not None:
            ids = [int(i) for i in to_plain(ids)]
            return Prompt(text=tokenizer.decode(ids), ids=ids, messages=messages)
        if not self.chat_template_kwargs:
            text, ids = render_chat(tokenizer, messages)
        else:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 **self.chat_template_kwargs)
            ids = encode(tokenizer, text)
        return Prompt(text=text, ids=ids, messages=messages)


def chosen_index(episode: EpisodeResult) -> int:
    """The episode's answer among its samples: ``chosen``, else the first sample carrying the voted answer, else 0."""
    if episode.chosen is not None:
        return episode.chosen
    if episode.answer is not None:
        for i, sample in enumerate(episode.samples):
            if sample.verdict is not None and episode.answer in (sample.verdict.extracted, sample.verdict.key):
                return i
    return 0
