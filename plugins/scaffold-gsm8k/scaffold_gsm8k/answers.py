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
* The number must stand alone: anything around it that could change its
  value makes the answer "not a plain number" (no reward). That is an
  operator or symbol (``5!``, ``5^2``, ``5 + x``, ``x * 5``, ``√5``,
  ``\\sqrt{5}``, ``5²``, ``- 5``, ``x >= 5``), letters glued to it (``5x``,
  ``5k``, ``5m``, ``5th``; only the multi-letter units in :data:`GLUED_UNITS`
  may be glued, as in ``5kg``), a single letter beside it (``5 x``), or a word
  in :data:`VALUE_WORDS` (``5 thousand``, ``5 squared``, ``negative 5``).
  ``5%`` is read as 5: GSM8K states percentages as the bare number.
* Numbers compare exactly as rationals through a canonical string:
  ``18 == 18.0 == 18.00``, ``1,000 == 1000``, ``-3 == -3``, ``1/2 == 0.5``.
  A fraction counts by its value: ``10/2`` and ``\\frac{10}{2}`` are 5.

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
_LATEX_WORDS = re.compile(
    r"\\(?:text|textbf|textrm|textit|textnormal|mathrm|mathbf|mathit|mbox|boxed|fbox|displaystyle|left|right"
    r"|quad|qquad)(?![A-Za-z])"
)
_BRACE = re.compile(r"[{}]")
# Order matters: "{,}" (a LaTeX thousands separator) before braces are dropped.
_REPLACEMENTS = (
    ("{,}", ","),
    ("\\$", "$"),
    ("\\%", "%"),
    ("\\,", ""),
    ("\\!", ""),
    ("\\ ", " "),
    ("\\;", " "),
    ("\\:", " "),
    ("\u2212", "-"),  # minus sign
    ("\u2013", "-"),  # en dash used as a minus
)

#: Words that change the value of a number beside them ("5 thousand", "5 squared", "sqrt 5", "negative 5",
#: "5 and a half", "5 (five)"): an answer holding one is not a plain number. "dozen" is not one: GSM8K
#: counts in dozens ("how many dozen eggs?" is answered "7 dozen").
VALUE_WORDS = frozenset("""
    hundred hundreds thousand thousands million millions billion billions trillion trillions
    lakh lakhs crore crores grand bn mn mln
    half halves third thirds quarter quarters fourth fourths fifth fifths tenth tenths
    hundredth hundredths thousandth thousandths
    squared cubed power powers exponent factorial sqrt root roots log ln exp sin cos tan pi
    plus minus negative divided multiplied
    two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
    seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
""".split())
#: The only letters that may be glued to a number ("5kg", "6th"): common multi-letter units and ordinal
#: suffixes. Other glued letters make it not a plain number: "5x", "5k" and "5m" (thousand? million?
#: metres?), "5e".
GLUED_UNITS = frozenset("""
    kg mg km cm mm ml lb lbs oz ft yd yds mi hr hrs min mins sec secs mph kph gal pcs kb mb gb tb
    st nd rd th
""".split())
# The text around a number, token by token: words (ASCII letters, inner ', & or -), whitespace, single characters.
_DRESSING_TOKEN = re.compile(r"[A-Za-z]+(?:['\u2019&-][A-Za-z]+)*|\s+|.", re.DOTALL)
_QUOTES = "\"'\u201c\u201d\u2018\u2019"
_CURRENCY = "$\u20ac\u00a3\u00a5\u20b9"  # $ € £ ¥ ₹
# Characters that may stand before / after the number (besides words and whitespace).
_BEFORE_MARKS = frozenset(":,.;([" + _QUOTES + _CURRENCY)
_AFTER_MARKS = frozenset("%\u00b0.,;:)](" + _QUOTES + _CURRENCY)  # \u00b0: the degree sign
# Single letters that are words, not variables or unit prefixes ("a day", "I think").
_LETTER_WORDS = frozenset("aAI")
# Operators and symbols that make flexible mode's last number an operand ("5!", "2^5", "x * 5", "10 - 5").
# Before it, "=" and ">" are fine: "= 18", a calculator annotation "<<9*2=18>>18".
_OPERATORS_AFTER = frozenset("^!*/+-_=<>~|\\")
_OPERATORS_BEFORE = frozenset("^*/+-_~|\\")
# How far past the last number flexible mode looks, and how far before it.
_FLEXIBLE_TAIL = 64
# A markdown emphasis pair around text ("**18**", "*Answer:*"): the opener is followed and the closer
# preceded by a non-space. Linear: each attempt stops at the next '*'.
_EMPHASIS = re.compile(r"(\*{1,3})([^*\s](?:[^*]*[^*\s])?)\1")


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
    cleaned = strip_emphasis(clean_answer_text(text))
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
    if match.start() or match.end() < len(cleaned):  # there is text around the number
        problem = _dressing_problem(cleaned[:match.start()], before=True) or \
            _dressing_problem(cleaned[match.end():], before=False)
        if problem:
            raise AnswerError(f"not a plain number: {problem}")
    return _key_of(match)


def strip_emphasis(text: str) -> str:
    """``text`` without markdown emphasis pairs ("**18**" -> "18"); a lone ``*`` (an operator) stays."""
    return _EMPHASIS.sub(r"\2", text) if "*" in text else text


def _is_word(token: str) -> bool:
    return token[0].isascii() and token[0].isalpha()


def _dressing_problem(text: str, *, before: bool) -> str | None:
    """Why ``text``, found right before (or after) a number, may change its value; None if it only dresses it.

    Allowed: whitespace, words (not a :data:`VALUE_WORDS` word, not a single letter), currency signs,
    quotes and punctuation; after the number also ``%``, the degree sign, a glued unit from
    :data:`GLUED_UNITS` and a rate such as ``/hour``. Everything else (an operator, a symbol, a glued
    letter, a LaTeX command) is a problem. Linear in ``len(text)``.
    """
    if not text or text.isspace():
        return None
    tokens = _DRESSING_TOKEN.findall(text)
    touching = len(tokens) - 1 if before else 0  # the token directly next to the number
    for i, token in enumerate(tokens):
        if token[0].isspace():
            continue
        if _is_word(token):
            if token.lower() in VALUE_WORDS:
                return f"{token!r} changes its value"
            glued_unit = not before and token.lower() in GLUED_UNITS
            if i == touching and not glued_unit:
                return f"{token!r} is glued to it"
            if len(token) == 1 and token not in _LETTER_WORDS:
                return f"the single letter {token!r} beside it"
            continue
        if token in "!?" and i > 0 and _is_word(tokens[i - 1]) and i - 1 != touching:
            continue  # sentence punctuation after a word ("18 apples!"), never "5!"
        if not before and token == "/" and i + 1 < len(tokens) and _is_word(tokens[i + 1]) \
                and len(tokens[i + 1]) > 1:
            continue  # a rate: "5/hour", "$5 dollars/day"
        if token in (_BEFORE_MARKS if before else _AFTER_MARKS):
            continue
        return f"{token!r} {'before' if before else 'after'} it"
    return None


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
    # The window runs a little past the last digit, to the end of its line, so that what follows the
    # number ("}" closing a \frac, "!", " thousand") is read with it.
    end = response.find("\n", last + 1, last + 1 + _FLEXIBLE_TAIL)
    window = clean_answer_text(response[start:end if end >= 0 else last + 1 + _FLEXIBLE_TAIL])
    match = None
    for match in _NUMBER.finditer(window):  # noqa: B007  # the last match is the one wanted
        pass
    if match is None:  # pragma: no cover - a digit always starts a match
        return None, None, "no number in the response"
    if match.start() == 0 and start > 0 and response[start - 1] in "0123456789,.":
        return None, None, _too_long("the last number")
    text = match.group().strip()
    problem = _operand_problem(window[:match.start()], window[match.end():])
    if problem:
        return text, None, f"the last number is not a plain number: {problem}"
    try:
        return text, _key_of(match), None
    except AnswerError as exc:
        return text, None, str(exc)


def _operand_problem(before: str, after: str) -> str | None:
    """Why flexible mode's last number is an operand or scaled ("5!", "2^5", "5 thousand"), else None.

    Only the neighbours count (the rest is prose): the tokens touching the number, the nearest
    non-blank one on each side, and the next word (the next three when it is "and" or "point", as in
    "5 and a half"). A run of ``*`` touching the number is markdown when a blank (or the text's end)
    lies on its other side ("**18**"), an operator otherwise ("x*5", "5*x").
    """
    return _problem_after(after) or _problem_before(before)


def _problem_after(after: str) -> str | None:
    """Why what follows flexible mode's last number makes it an operand or scales it, else None."""
    tokens = _DRESSING_TOKEN.findall(after[:_FLEXIBLE_TAIL])
    i = 0
    while i < len(tokens) and tokens[i] == "*":
        i += 1
    if i and i < len(tokens) and not (tokens[i][0].isspace() or tokens[i] in _AFTER_MARKS):
        return "'*' after it"
    if i < len(tokens) and _is_word(tokens[i]) and tokens[i].lower() not in GLUED_UNITS:
        return f"{tokens[i]!r} is glued to it"
    while i < len(tokens) and tokens[i][0].isspace():
        i += 1
    if i < len(tokens):
        token = tokens[i]
        if _is_word(token) and len(token) == 1 and token not in _LETTER_WORDS:
            return f"the single letter {token!r} beside it"
        if token == "/" and i + 1 < len(tokens) and _is_word(tokens[i + 1]) and len(tokens[i + 1]) > 1:
            pass  # a rate: "5/hour"
        elif not _is_word(token) and (token in _OPERATORS_AFTER or not token.isascii() and token not in _AFTER_MARKS):
            return f"{token!r} after it"
    words = [token for token in tokens[i:i + 6] if _is_word(token)][:3]
    if words and words[0].lower() not in ("and", "point"):
        words = words[:1]
    for word in words:
        if word.lower() in VALUE_WORDS:
            return f"{word!r} changes its value"
    return None


def _problem_before(before: str) -> str | None:
    """Why what precedes flexible mode's last number makes it an operand or scales it, else None."""
    tokens = _DRESSING_TOKEN.findall(before[-_FLEXIBLE_TAIL:])
    j = len(tokens) - 1
    if j >= 0 and tokens[j].isdigit():
        return f"{tokens[j]!r} before it"  # "10-5": the sign is a minus
    if j >= 1 and _is_word(tokens[j]) and tokens[j - 1].isdigit():
        return f"{tokens[j]!r} between it and another number"  # "2e2", "5x5"
    touching = j
    while j >= 0 and tokens[j] == "*":
        j -= 1
    if j < touching and j >= 0 and not tokens[j][0].isspace():
        return "'*' before it"
    same_line = True
    while j >= 0 and (tokens[j][0].isspace() or tokens[j] in "(["):
        same_line = same_line and "\n" not in tokens[j]
        j -= 1
    if j < 0:
        return None
    token, previous = tokens[j], tokens[j - 1] if j > 0 else ""
    if same_line and (token.isdigit() or token in ")]"):
        return "another number just before it"  # "5 5", "2(2)", "(3)(2)"
    if _is_word(token):
        if token.lower() in VALUE_WORDS:
            return f"{token!r} changes its value"
        if previous == "\\":
            return f"'\\{token}' before it"  # a LaTeX operator: \div, \times, \approx
    elif token == "=" and previous in ("<", ">", "!"):
        return f"an inequality ('{previous}=') before it"
    elif token == "<" or (token == ">" and previous != ">"):  # "x > 5"; a calculator's "<<9*2=18>>18" is fine
        return f"{token!r} before it"
    elif token in _OPERATORS_BEFORE or not token.isascii() and token not in _BEFORE_MARKS:
        return f"{token!r} before it"
    return None


def answer_number(text: str) -> str:
    """The canonical key of an answer region: its single number, or an equation's final value.

    ``"3500 + 1 = 3510"`` answers 3510: only what follows the last ``=`` counts.
    """
    at = text.rfind("=")
    if at > 0 and text[at - 1] in "<>!":
        raise AnswerError(f"not a plain number: an inequality ({text[at - 1:at + 1]!r})")
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
    if reason.startswith("not a plain number"):
        return reason
    return reason if reason == "not a number" else f"not usable ({reason})"
