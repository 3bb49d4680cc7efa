"""Chat rendering over any tokenizer, and a tiny byte tokenizer for tests and benchmarks.

Prompts are rendered with the engine tokenizer's chat template and tokenized
once; from then on the runtime works on token ids only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], *,
                add_generation_prompt: bool = True) -> tuple[str, list[int]]:
    """Render ``messages`` with the tokenizer's chat template; return (text, token ids).

    Works with Hugging Face tokenizers (transformers 4 and 5) and with any
    object offering ``apply_chat_template(messages, tokenize=False,
    add_generation_prompt=...)`` and ``encode(text, add_special_tokens=False)``.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat template; set the task's prompt format "
            "or use a chat model"
        )
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    return text, encode(tokenizer, text)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (the template already has them)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return list(ids)


def response_text(tokenizer: Any, ids: Sequence[int], stops: Sequence[str] = ()) -> str:
    """A response's text: ``ids`` decoded without special tokens, cut at the first stop string."""
    if not ids:
        return ""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return text[:cut] if cut >= 0 else text


def eos_token_ids(tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(i) for i in eos)
    return ids


class ByteTokenizer:
    """A dependency-free tokenizer: one token per UTF-8 byte, plus a few special tokens.

    It has a chat template of its own (``<|role|>`` headers, ``<|end|>``
    terminators), so tasks render prompts with it exactly as with a real
    tokenizer. Used by the benchmark engine and the test kit.
    """

    SPECIALS = ("<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>")
    OFFSET = len(SPECIALS)
    chat_template = "byte-chat"
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2

    @property
    def vocab_size(self) -> int:
        return self.OFFSET + 256

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], tokenize: bool = True,
                            add_generation_prompt: bool = False, **_: Any) -> Any:
        parts = []
        for message in messages:
            role = message.get("role", "user")
            parts.append(f"<|{role}|>\n{message.get('content', '')}<|end|>\n")
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        text = "".join(parts)
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            if text[i] == "<":
                for sid, special in enumerate(self.SPECIALS):
                    if text.startswith(special, i):
                        ids.append(sid)
                        i += len(special)
                        break
                else:
                    ids.append(ord("<") + self.OFFSET)
                    i += 1
                continue
            j = text.find("<", i)
            chunk = text[i:] if j < 0 else text[i:j]
            ids.extend(map(_BYTE_IDS.__getitem__, chunk.encode("utf-8")))
            i += len(chunk)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        offset = self.OFFSET
        if ids and min(ids) >= offset:  # bytes only (the common case): one conversion, one decode
            return bytes(tid - offset for tid in ids).decode("utf-8", errors="replace")
        out = bytearray()
        text: list[str] = []
        for tid in ids:
            if tid < self.OFFSET:
                if out:
                    text.append(out.decode("utf-8", errors="replace"))
                    out = bytearray()
                if not skip_special_tokens:
                    text.append(self.SPECIALS[tid])
            else:
                out.append(tid - self.OFFSET)
        if out:
            text.append(out.decode("utf-8", errors="replace"))
        return "".join(text)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (a special token: its text)."""
        if token_id < self.OFFSET:
            return self.SPECIALS[token_id].encode()
        return bytes([token_id - self.OFFSET])


#: Token id of each byte value (bytes come after the special tokens).
_BYTE_IDS = tuple(range(ByteTokenizer.OFFSET, ByteTokenizer.OFFSET + 256))
