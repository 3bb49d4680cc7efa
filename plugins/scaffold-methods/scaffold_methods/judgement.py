"""Reading a model judge's reply: a score on a scale, or the probability of "Yes".

A malformed judgement (no score, several different scores, a score outside
the scale, an empty reply) gives ``None``: the response is unscored, never
0.0, which would read as "judged wrong".

Scores the parser accepts (the last 20,000 characters of the reply are read):

* labelled: ``Score: 7``, ``score = 7.5``, ``Rating: 8/10``, ``**Score:** 6``,
  ``The score is 9``, ``Grade of 4/5`` (a denominator other than the
  scale's top rescales: 4/5 on a 0-10 scale is 8);
* bracketed: ``[[7]]``;
* a bare number, when it is the whole reply: ``7``, ``7/10``, ``7.``.

Several labelled or bracketed scores must agree; if they differ the
judgement is malformed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

MAX_CHARS = 20_000
_NUMBER = r"(-?\d{1,12}(?:\.\d{1,12})?)"
_LABELLED = re.compile(
    r"\b(?:score|rating|grade)\b[*_\s]{0,4}(?:[:=]|\bis\b|\bof\b)[*_\s]{0,4}\[?[ \t]{0,4}" + _NUMBER
    + r"(?:[ \t]{0,4}/[ \t]{0,4}" + _NUMBER + r")?", re.IGNORECASE)
_BRACKETED = re.compile(r"\[\[[ \t]{0,4}" + _NUMBER + r"[ \t]{0,4}\]\]")
_BARE = re.compile(r"[ \t\n]{0,16}" + _NUMBER + r"(?:[ \t]{0,4}/[ \t]{0,4}" + _NUMBER + r")?[ \t]{0,4}\.?[ \t\n]{0,16}")


def parse_score(text: str | None, low: float = 0.0, high: float = 10.0) -> tuple[float | None, str]:
    """(the judgement's score normalised to [0, 1], or None when malformed; the reason)."""
    if not low < high:
        raise ValueError(f"the scale needs low < high, got ({low}, {high})")
    if not isinstance(text, str) or not text.strip():
        return None, "empty judgement"
    text = text[-MAX_CHARS:]
    found = [_value(m.group(1), m.group(2), low, high) for m in _LABELLED.finditer(text)]
    found += [_value(m.group(1), None, low, high) for m in _BRACKETED.finditer(text)]
    if not found:
        bare = _BARE.fullmatch(text)
        if bare is None:
            return None, "no score in the judgement"
        found = [_value(bare.group(1), bare.group(2), low, high)]
    values = {v for v in found if v is not None}
    if not values:
        return None, f"score outside the scale {low:g}-{high:g}"
    if len(values) > 1:
        return None, f"conflicting scores {sorted(values)}"
    value = values.pop()
    return (value - low) / (high - low), f"score {value:g} of {low:g}-{high:g}"


def _value(number: str, denominator: str | None, low: float, high: float) -> float | None:
    try:
        value = float(number)
        if denominator is not None:
            over = float(denominator)
            if over <= 0:
                return None
            if over != high:
                value = low + value / over * (high - low)
    except ValueError:
        return None
    if not math.isfinite(value) or not low <= value <= high:
        return None
    return value


def yes_probability(top: Mapping[str, float] | None, sampled: tuple[str, float] | None) -> tuple[float | None, str]:
    """P(yes) / (P(yes) + P(no)) from a one-token judgement.

    ``top`` maps the most likely first tokens' texts to their logprobs (any
    case and surrounding space: "Yes", " yes"). Without them, ``sampled``
    (the token the judge answered and its logprob) gives ``p`` for "yes" and
    ``1 - p`` for "no". Neither word among them: None (unscored).
    """
    if top:
        yes = sum(math.exp(lp) for word, lp in top.items() if _word(word) == "yes" and not math.isnan(lp))
        no = sum(math.exp(lp) for word, lp in top.items() if _word(word) == "no" and not math.isnan(lp))
        if yes + no > 0:
            return yes / (yes + no), f"p(yes) {yes:.3g}, p(no) {no:.3g}"
    if sampled is not None:
        word, lp = _word(sampled[0]), sampled[1]
        if word in ("yes", "no") and not math.isnan(lp):
            p = min(1.0, math.exp(lp))
            return (p if word == "yes" else 1.0 - p), f"answered {word} (p {p:.3g})"
    return None, "neither yes nor no in the judgement"


def _word(token: Any) -> str:
    return str(token).strip().strip(".,:;!*").lower()
