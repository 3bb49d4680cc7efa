"""Find the final answer in a model response and reduce numbers to a canonical form.

The policy (see the plugin README):

* The final answer is the text after the **last** ``####``, up to the end of
  that line. If the response has no ``####``, it is the content of the
  **last** ``\\boxed{...}``. If it has neither, there is no answer, except in
  flexible mode, which then takes the last number anywhere in the response.
* Only the last marker counts. Whatever follows it is the answer: an empty or
  non-numeric answer there is "no answer"; earlier markers are never
  consulted.
* An answer must hold exactly one number. Words, ``$``, ``%``, a trailing
  period or markdown around it are ignored ("18 dollars", "$18.", "**18**");
  a second number makes it ambiguous ("18 or 19" scores 0). An equation
  counts by its final value: in "3500 + 1 = 3510" only what follows the last
  ``=`` is read.
* Numbers compare exactly as rationals through a canonical string:
  ``18 == 18.0 == 18.00``, ``1,000 == 1000``, ``-3 == -3``, ``1/2 == 0.5``.

* An answer region longer than :data:`MAX_ANSWER_CHARS` characters is no
  answer: no GSM8K answer is that long, and the cap bounds the cost.

Cost is bounded: finding the last marker is a linear scan in C (``rfind``);
every regular expression then runs on at most :data:`MAX_ANSWER_CHARS`
characters, with no backtracking-prone patterns, no ``int()`` of long digit
strings, no eval and no sympy. A megabyte of adversarial text is scored in
about a millisecond (``python bench/gsm8k_verifier.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MARKER = "####"
BOXED = "\\boxed"

#: The longest answer region (after ``####``, inside ``\boxed{}``, or flexible mode's last number) read.
MAX_ANSWER_CHARS = 1000
#: How many braces the search for the end of a ``\boxed{`` may step over.
MAX_BOXED_BRACES = 64

# A number: an optional sign (attached) and currency in either order, digits with
# optional thousands separators, an optional decimal part, an optional "/q".
# Matching at one position costs time linear in the length of the number found there.
_NUMBER = re.compile(
    r"""
    (?P<sign>[-+])?(?:\$[ \t]?)?(?P<sign2>[-+])?
    (?:
        (?P<int>\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:\.(?P<frac>\d+))?
      | \.(?P<frac_only>\d+)
    )
    (?:[ \t]?/[ \t]?(?P<den>\d+))?
    """,
    re.VERBOSE | re.ASCII,
)
_DIGIT = re.compile(r"\d", re.ASCII)
_MAX_PREFIX = 5  # the longest prefix before a number's first digit, as in "-$ -.5"
_FRAC_LATEX = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}", re.ASCII)
_LATEX_WORDS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|boxed|displaystyle|left|right)\b")
_BRACE = re.compile(r"[{}]")
# Order matters: "{,}" (a LaTeX thousands separator) before braces are dropped.
_REPLACEMENTS = (
    ("{,}", ","),
    ("\\$", "$"),
    ("\\%", "%"),
    ("\\,", ""),
    ("\\!", ""),
    ("\\ ", " "),
    ("\u2212", "-"),  # minus sign
    ("\u2013", "-"),  # en dash used as a minus
)


class AnswerError(ValueError):
    """The text holds no single usable number; ``str(exc)`` says why in a few words."""


@dataclass(frozen=True, slots=True)
class Extraction:
    """What :func:`extract_answer` found.

    ``text``: the answer as written in the response (``None`` when there is
    no answer region at all). ``key``: its canonical number, or ``None``.
    ``source``: ``"####"``, ``"boxed"``, ``"last number"`` or ``"none"``.
    ``problem``: why there is no key, in a few words (``None`` when there is one).
    """

    text: str | None
    key: str | None
    source: str
    problem: str | None = None


# ---------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------


def clean_answer_text(text: str) -> str:
    """Undo the LaTeX and typography a model may wrap a number in (linear time)."""
    if "\\" in text:
        text = _FRAC_LATEX.sub(r"\1/\2", text)
        text = _LATEX_WORDS.sub(" ", text)
    for old, new in _REPLACEMENTS:
        if old in text:
            text = text.replace(old, new)
    if "{" in text or "}" in text:
        text = text.replace("{", " ").replace("}", " ")
    return text


def _decimal_key(negative: bool, int_digits: str, frac_digits: str) -> str:
    whole = int_digits.lstrip("0")
    frac = frac_digits.rstrip("0")
    if not whole and not frac:
        return "0"
    return ("-" if negative else "") + (whole or "0") + ("." + frac if frac else "")


def _fraction_key(value: Fraction) -> str:
    """The canonical form of a rational: a terminating decimal when there is one, else ``p/q``."""
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    shift = max(twos, fives)
    scaled = abs(value.numerator) * 10**shift // value.denominator
    digits = str(scaled).rjust(shift + 1, "0")
    whole, frac = (digits[:-shift], digits[-shift:]) if shift else (digits, "")
    return _decimal_key(value < 0, whole, frac)


def _key_of(match: re.Match[str]) -> str:
    signs = [s for s in (match.group("sign"), match.group("sign2")) if s]
    if len(signs) > 1:
        raise AnswerError("two signs on one number")
    negative = signs == ["-"]
    int_part = (match.group("int") or "").replace(",", "")
    frac = match.group("frac") or match.group("frac_only") or ""
    den = match.group("den")
    if den is None:
        return _decimal_key(negative, int_part, frac)
    if frac:
        raise AnswerError("a fraction with a decimal numerator")
    if len(int_part) + len(den) > MAX_ANSWER_CHARS:  # int() of long digit strings is quadratic
        raise AnswerError(f"a fraction with more than {MAX_ANSWER_CHARS} digits")
    if int(den) == 0:
        raise AnswerError("a fraction with denominator 0")
    value = Fraction(int(int_part), int(den))
    return _fraction_key(-value if negative else value)


def canonical_number(text: str) -> str:
    """The canonical key of the single number in ``text``.

    Raises :class:`AnswerError` when ``text`` holds no number or more than one.
    """
    cleaned = clean_answer_text(text)
    digit = _DIGIT.search(cleaned)
    if digit is None:
        raise AnswerError("not a number")
    # Start the search just before the first digit: a megabyte of '-' or '$' is then never tried,
    # position by position, as a number's prefix.
    match = _NUMBER.search(cleaned, max(0, digit.start() - _MAX_PREFIX))
    if match is None:  # pragma: no cover - a digit always starts a match
        raise AnswerError("not a number")
    if _DIGIT.search(cleaned, match.end()) is not None:
        raise AnswerError("more than one number")
    return _key_of(match)


def gold_answer(answer: str) -> str:
    """The gold answer text of a GSM8K worked solution: what follows its final ``####``.

    A text without ``####`` is taken whole (a bare answer such as ``"18"``).
    """
    at = answer.rfind(MARKER)
    return (answer[at + len(MARKER):] if at >= 0 else answer).strip()


# ---------------------------------------------------------------------------
# Answer regions
# ---------------------------------------------------------------------------


def _too_long(where: str) -> str:
    return f"{where} is longer than {MAX_ANSWER_CHARS} characters"


def _after_last_marker(response: str, at: int) -> tuple[str | None, str | None]:
    """The answer line after the ``####`` at ``at`` (its first non-blank line), or the problem."""
    rest = response[at + len(MARKER):]
    start = len(response) - len(rest.lstrip())
    end = response.find("\n", start, start + MAX_ANSWER_CHARS + 1)
    if end < 0:
        end = len(response)
    if end - start > MAX_ANSWER_CHARS:
        return None, _too_long("the answer after the last '####'")
    return response[start:end].strip(), None


def _last_boxed(response: str, at: int) -> tuple[str | None, str | None]:
    """Content of the ``\\boxed`` at ``at`` (or None) and the problem when there is none."""
    pos = at + len(BOXED)
    while pos < len(response) and response[pos] in " \t" and pos - at < 16:
        pos += 1
    if pos >= len(response) or response[pos] != "{":
        return None, "malformed \\boxed (no '{' after it)"
    limit = min(len(response), pos + 1 + MAX_ANSWER_CHARS + 1)
    depth = 1
    scan = pos + 1
    for _ in range(MAX_BOXED_BRACES):
        brace = _BRACE.search(response, scan, limit)
        if brace is None:
            if limit < len(response):
                return None, _too_long("the \\boxed{} content")
            return None, "unclosed \\boxed{"
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return response[pos + 1:brace.start()].strip(), None
        scan = brace.end()
    return None, f"\\boxed{{}} with more than {MAX_BOXED_BRACES} braces"


def _last_number(response: str) -> tuple[str | None, str | None, str | None]:
    """(text, key, problem) of the last number in ``response``."""
    last = max(response.rfind(d) for d in "0123456789")
    if last < 0:
        return None, None, "no number in the response"
    start = max(0, last + 1 - MAX_ANSWER_CHARS)
    window = clean_answer_text(response[start:last + 1])
    match = None
    for match in _NUMBER.finditer(window):  # noqa: B007  # the last match is the one wanted
        pass
    if match is None:  # pragma: no cover - a digit always starts a match
        return None, None, "no number in the response"
    if match.start() == 0 and start > 0 and response[start - 1] in "0123456789,.":
        return None, None, _too_long("the last number")
    try:
        return match.group().strip(), _key_of(match), None
    except AnswerError as exc:
        return match.group().strip(), None, str(exc)


def answer_number(text: str) -> str:
    """The canonical key of an answer region: its single number, or an equation's final value.

    ``"3500 + 1 = 3510"`` answers 3510: only what follows the last ``=`` counts.
    """
    at = text.rfind("=")
    return canonical_number(text[at + 1:] if at >= 0 else text)


def extract_answer(response: str, *, flexible: bool = False) -> Extraction:
    """Find the final answer of ``response`` under the policy in this module's docstring."""
    at = response.rfind(MARKER)
    if at >= 0:
        text, problem = _after_last_marker(response, at)
        if text is None:
            return Extraction(None, None, MARKER, problem)
        if not text:
            return Extraction("", None, MARKER, "empty answer after the last '####'")
        try:
            return Extraction(text, answer_number(text), MARKER)
        except AnswerError as exc:
            return Extraction(text, None, MARKER, f"answer after the last '####' is {_describe(exc)}")
    at = response.rfind(BOXED)
    if at >= 0:
        text, problem = _last_boxed(response, at)
        if text is None:
            return Extraction(None, None, "boxed", problem)
        if not text:
            return Extraction("", None, "boxed", "empty \\boxed{}")
        try:
            return Extraction(text, answer_number(text), "boxed")
        except AnswerError as exc:
            return Extraction(text, None, "boxed", f"answer in the last \\boxed{{}} is {_describe(exc)}")
    if flexible:
        text, key, problem = _last_number(response)
        return Extraction(text, key, "last number", problem)
    return Extraction(None, None, "none", "no '####' or \\boxed{} answer in the response")


def _describe(exc: AnswerError) -> str:
    reason = str(exc)
    if reason == "more than one number":
        return "ambiguous (more than one number)"
    return reason if reason == "not a number" else f"not usable ({reason})"
