"""The bookkeeping of one request while a batch decodes it, shared by the in-process engines.

A :class:`DecodeRow` holds what a request has produced so far (ids, logprobs,
the weight version of each token, top logprobs) and its stopping rules;
:func:`take_token` appends one sampled token and decides whether the row is
done; :func:`result_of` turns a finished row into a
:class:`~scaffold_core.generation.GenerationResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..generation import GenerationRequest, GenerationResult
from ..spans import META_KEY


@dataclass(eq=False)
class DecodeRow:
    """Decode state of one request inside a batch."""

    request: GenerationRequest
    future: Any  # the caller's future: a done one means the caller stopped waiting
    max_new: int
    stop_ids: set[int]
    stop_strings: tuple[str, ...]
    generator: Any  # torch.Generator seeded for the request; None for greedy
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weight version that sampled each output id
    top: list[dict[int, float]] | None = None  # per output position, when the request asked for top logprobs
    finish: str | None = None
    stop_at: int | None = None  # character offset where a stop string begins
    grammar: Any = None  # the request's constraint, compiled (grammar.py's RowGrammar), if any
    loop: Any = None  # the caller's event loop: a streaming request's on_token is called there
    #: Where the request's time went (scaffold_core.spans): (phase, start, end) on spans.clock; reported in
    #: the result's meta. ``decode_from``: when its current stretch of decoding began.
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    decode_from: float = 0.0


def new_row(torch: Any, request: GenerationRequest, future: Any, *, eos_ids: set[int],
            context_length: int | None, grammar: Any = None, loop: Any = None) -> DecodeRow:
    """A row for ``request``: its token budget within the context, stop ids, and seeded generator."""
    sp = request.sampling
    max_new = sp.max_tokens
    if context_length:
        max_new = max(1, min(max_new, context_length - len(request.prompt_ids)))
    gen = None
    if not sp.greedy:
        gen = torch.Generator(device="cpu")
        seed = request.seed if request.seed is not None else (sp.seed if sp.seed is not None else torch.seed())
        gen.manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return DecodeRow(request, future, max_new, eos_ids | set(sp.stop_token_ids), tuple(s for s in sp.stop if s),
                     gen, top=[] if sp.top_logprobs > 0 else None, grammar=grammar, loop=loop)


def take_token(row: DecodeRow, token: int, logprob: float, version: int, tokenizer: Any) -> bool:
    """Append a sampled token; True when the row is finished (``row.finish`` then says why)."""
    row.output_ids.append(token)
    row.logprobs.append(logprob)
    row.versions.append(version)
    if row.grammar is not None:
        row.grammar.accept(token)
    if row.request.on_token is not None and row.loop is not None:  # a streaming caller: the id, on its loop
        row.loop.call_soon_threadsafe(row.request.on_token, token)
    if row.future.done():  # its caller is gone (cancelled, timed out): stop decoding it
        row.finish = "abort"  # (a read of the future's state; at worst one token late)
    elif token in row.stop_ids:
        row.finish = "stop"
    elif row.stop_strings and _hit_stop_string(row, tokenizer):
        row.finish = "stop"
    elif row.grammar is not None and row.grammar.done:
        row.finish = "stop"
    elif len(row.output_ids) >= row.max_new:
        row.finish = "length"
    return row.finish is not None


def record_top(rows: list[DecodeRow], tops: list[dict[int, float] | None]) -> None:
    """Append this step's top logprobs to the rows that asked for them."""
    for row, top in zip(rows, tops):
        if row.top is not None and top is not None:
            row.top.append(top)


def result_of(row: DecodeRow, tokenizer: Any) -> GenerationResult:
    text = tokenizer.decode(row.output_ids, skip_special_tokens=True)
    if row.stop_at is not None:
        text = text[: row.stop_at]
    return GenerationResult(row.output_ids, row.logprobs, row.finish or "abort", text, row.versions[0],
                            versions=row.versions, top_logprobs=row.top,
                            meta={META_KEY: row.spans} if row.spans else {})


def _hit_stop_string(row: DecodeRow, tokenizer: Any) -> bool:
    text = tokenizer.decode(row.output_ids, skip_special_tokens=True)
    for stop in row.stop_strings:
        # Only the newest token can complete a match; search the tail that could contain it.
        at = text.find(stop, max(0, len(text) - len(stop) - 16))
        if at >= 0:
            row.stop_at = at if row.stop_at is None else min(row.stop_at, at)
    return row.stop_at is not None
