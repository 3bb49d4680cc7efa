"""The raw bytes of a token, as OpenAI's logprobs report them (``bytes``), partial UTF-8 characters included.

A byte-level BPE token (GPT-2, Llama 3, Qwen, SmolLM2) may hold part of a character: its
decoded text alone is U+FFFD, whose bytes rebuild nothing. The bytes come from the token's
vocabulary entry instead: the byte-level alphabet mapped back to bytes, SentencePiece's
``<0xNN>`` byte tokens and ``▁`` spaces; a tokenizer that knows its tokens' bytes
(``token_bytes``) is asked. The concatenated bytes of a choice's tokens are the UTF-8 of
its text. A token whose bytes are not valid UTF-8 by themselves is written
``bytes:\\xNN...`` as its ``token``, as OpenAI does.
"""

from __future__ import annotations

import weakref
from typing import Any

from scaffold_core.chat_template import decode_keep_special

_CACHE: weakref.WeakKeyDictionary[Any, dict[int, bytes]] = weakref.WeakKeyDictionary()


def _byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (each byte as a printable character) back to bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


BYTE_DECODER = _byte_decoder()


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The bytes token ``token_id`` stands for (cached per tokenizer)."""
    try:
        cache = _CACHE.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        cache = {}
    found = cache.get(token_id)
    if found is None:
        found = cache[token_id] = _bytes(tokenizer, token_id)
    return found


def _bytes(tokenizer: Any, token_id: int) -> bytes:
    own = getattr(tokenizer, "token_bytes", None)
    if callable(own):
        return bytes(own(token_id))
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    piece = None
    if token_id not in special and hasattr(tokenizer, "convert_ids_to_tokens"):
        piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str) and piece:
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # SentencePiece byte fallback
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        if all(ch in BYTE_DECODER for ch in piece):  # byte-level BPE
            return bytes(BYTE_DECODER[ch] for ch in piece)
        if "▁" in piece:  # SentencePiece words
            return piece.replace("▁", " ").encode("utf-8")
    return decode_keep_special(tokenizer, [token_id]).encode("utf-8")


def token_text(raw: bytes) -> str:
    """The ``token`` string of a token's bytes: its text, or ``bytes:\\xNN...`` when they are no whole characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
