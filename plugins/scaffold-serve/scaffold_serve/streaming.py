"""Token-by-token text for streamed calls: the content a client may see so far, as the engine samples it.

An engine that decodes incrementally (the embedded engine) hands each sampled id to
:meth:`TextStream.push`, which answers the new content to send, holding back what may
still change: an incomplete UTF-8 character, the beginning of a stop string (never
sent: OpenAI's stop semantics), and, when the call has tools, everything from the first
``<`` on (it may be a tool call, which is sent as a call once the turn is complete) and
surrounding whitespace (the content of a turn with calls is trimmed). :meth:`rest` is
what remains to send of the final content once the choice is known.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    def __init__(self, tokenizer: Any, stops: tuple[str, ...], tools: bool):
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.keep = max((len(s) for s in self.stops), default=1) - 1
        self.tools = tools
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def push(self, token: int) -> str:
        """The content to send now that ``token`` was sampled ("" when nothing new is safe to send)."""
        self.ids.append(token)
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a character still incomplete
            return ""
        safe = text
        for stop in self.stops:
            at = safe.find(stop)
            if at >= 0:
                safe, self.stopped = safe[:at], True
        if self.stops and not self.stopped and self.keep:
            safe = safe[:max(0, len(safe) - self.keep)]
        if self.tools:
            at = safe.find("<")
            safe = (safe if at < 0 else safe[:at]).strip()
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def rest(self, content: str | None) -> str:
        """What is left to send of the choice's final ``content``."""
        content = content or ""
        return content[len(self.sent):] if content.startswith(self.sent) else ""
