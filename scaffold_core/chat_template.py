"""Template boundaries: the exact tokens that follow a model turn, found by rendering, never by re-encoding.

The model's sampled ids are never decoded and re-encoded. What goes *between*
two model turns (the end of the assistant turn, the environment's messages,
the header of the next assistant turn) is found by rendering the conversation
with the chat template, with a sentinel string in place of the assistant's
content: the text after the sentinel is exactly what the template puts after
the content. Only that text is tokenized.

A model that stops on its end-of-turn token (``<|im_end|>`` for ChatML
templates such as SmolLM2's) has already produced the start of that text;
those characters are not tokenized again. A model cut off by ``max_tokens``
has produced none of it, so the turn is closed explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .tokenizers import encode

#: Stands in for an assistant turn's content while rendering; no template changes it, no model writes it.
SENTINEL = "SCAFFOLDxTURNx5f3c9a"


class TemplateError(ValueError):
    """The chat template cannot render a multi-turn conversation as needed; the message says why."""


def render_text(tokenizer: Any, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool,
                template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The chat template's text for ``messages`` (``template_kwargs``, e.g. ``tools=``, passed through)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError(f"tokenizer {type(tokenizer).__name__} has no chat template: multi-turn chat needs one "
                            "(use an instruct/chat model)")
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **(template_kwargs or {}))
    except Exception as exc:
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise TemplateError(f"the chat template could not render the conversation (roles: {roles}): "
                            f"{type(exc).__name__}: {exc}") from exc


def decode_keep_special(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of ``ids`` with special tokens kept and no clean-up, so the template renders them back as ids."""
    if not ids:
        return ""
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except TypeError:  # tokenizers without the clean-up option (the core's ByteTokenizer)
        return tokenizer.decode(list(ids), skip_special_tokens=False)


def decode_plain(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of ``ids`` without special tokens: what environments and verifiers read."""
    if not ids:
        return ""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


@dataclass(slots=True)
class Boundary:
    """What follows an assistant turn's content in the template's rendering.

    ``before``: the rendered text up to the content (what the model saw as
    its prompt, if the template is append-only). ``after``: the text after
    the content: the turn's end, any environment messages, and (when another
    turn follows) the next assistant header.
    """

    before: str
    after: str


def boundary(tokenizer: Any, history: Sequence[dict[str, Any]], following: Sequence[dict[str, Any]], *,
             add_generation_prompt: bool, template_kwargs: Mapping[str, Any] | None = None) -> Boundary:
    """Render ``history`` (ending with an assistant turn) plus ``following`` with a sentinel as that turn's content."""
    if not history or history[-1].get("role") != "assistant":
        raise TemplateError("internal: the history must end with the assistant turn being closed")
    probe = [*history[:-1], {**history[-1], "content": SENTINEL}, *following]
    text = render_text(tokenizer, probe, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs)
    at = text.rfind(SENTINEL)
    if at < 0:
        raise TemplateError(
            "the chat template dropped the content of the last assistant turn when more messages followed; "
            "multi-turn chat needs a template that renders every assistant turn")
    return Boundary(before=text[:at], after=text[at + len(SENTINEL):])


def covered_prefix(tokenizer: Any, output_ids: Sequence[int], after: str) -> int:
    """How many characters of ``after`` the model's last sampled token already produced.

    A model that stops on the template's end-of-turn token (SmolLM2's
    ``<|im_end|>``, the core ByteTokenizer's ``<|end|>``) has produced the
    first characters of ``after``; anything else (a turn cut by
    ``max_tokens``, a different stop token) has produced none of it.
    """
    if not output_ids:
        return 0
    last = decode_keep_special(tokenizer, output_ids[-1:])
    if last and _is_special(tokenizer, output_ids[-1]) and after.startswith(last):
        return len(last)
    return 0


def _is_special(tokenizer: Any, token_id: int) -> bool:
    special = getattr(tokenizer, "all_special_ids", None)
    if special is not None:
        return token_id in set(special)
    specials = getattr(tokenizer, "SPECIALS", None)  # the core ByteTokenizer
    if specials is not None:
        return 0 <= token_id < len(specials)
    return False


def tail_tokens(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text that follows a model turn (no special tokens added)."""
    return encode(tokenizer, text) if text else []
