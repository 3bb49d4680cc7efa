"""Scripted replies for fake inference servers: the token ids a fake server answers a prompt with.

Fakes of a trainer's servers (AReaL's ``agenerate``, verl's
``server_manager.generate``) sample an answer token by token; these build
the answer over the :class:`~scaffold_core.tokenizers.ByteTokenizer`: the
text's ids with EOS appended. Each returns ``respond(prompt_ids) -> ids``.
"""

from __future__ import annotations

from collections.abc import Callable

from scaffold_core.tokenizers import ByteTokenizer

TOKENIZER = ByteTokenizer()
EOS = TOKENIZER.eos_token_id

Respond = Callable[[list[int]], list[int]]


def answers(*texts: str) -> Respond:
    """Answers the n-th request with ``texts[n]`` (the last one repeats)."""
    if not texts:
        raise ValueError("answers() needs at least one text")
    calls = {"n": 0}

    def respond(prompt_ids: list[int]) -> list[int]:
        text = texts[min(calls["n"], len(texts) - 1)]
        calls["n"] += 1
        return TOKENIZER.encode(text) + [EOS]

    return respond


def by_turn(*texts: str) -> Respond:
    """Answers turn t of a conversation (t assistant headers in the prompt) with ``texts[t - 1]`` (the last repeats)."""
    if not texts:
        raise ValueError("by_turn() needs at least one text")

    def respond(prompt_ids: list[int]) -> list[int]:
        turn = TOKENIZER.decode(prompt_ids).count("<|assistant|>")
        return TOKENIZER.encode(texts[max(1, min(turn, len(texts))) - 1]) + [EOS]

    return respond
