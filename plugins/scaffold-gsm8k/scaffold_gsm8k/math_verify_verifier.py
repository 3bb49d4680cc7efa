"""The ``math_verify`` verifier: symbolic comparison with Hugging Face's math-verify (optional extra).

It finds the final answer with the same anchored policy as the ``gsm8k``
verifier (the last ``####``, else the last ``\\boxed{}``; never "any number
anywhere"), then compares the **whole** answer with the gold one:

* A plain number, as the ``gsm8k`` verifier reads it ("18", "$1,600.",
  "18 dollars", "50%", "x = 18"), is compared by its canonical value.
* Anything else is read as one LaTeX expression, never as the number it
  starts with: ``5^{100}``, ``5!``, ``5x``, ``5e3`` and ``5 \\times 3`` are
  not 5, while ``2 \\cdot 9`` and ``\\sqrt{324}`` are 18. :func:`latex_answer`
  shapes it (the final value of an equation; ``$``/``\\(`` delimiters,
  markdown, ``\\text{}``, a leading phrase and a trailing unit removed) or
  refuses it (a word from :data:`~scaffold_gsm8k.answers.VALUE_WORDS`, words
  inside the expression as in "18 or 19", two numbers side by side, a
  subscript, an inequality, unbalanced braces). math-verify then parses
  exactly that expression: it is wrapped in a ``\\boxed{}`` that its
  extraction takes whole (first match only, no fallback string), so a parse
  failure is "no answer", never a number pulled from part of the text.

math-verify bounds its own work with ``signal.alarm``, which only works on a
process's main thread. This verifier therefore declares ``executor =
"process"``: the core runs it in worker processes (where it is on the main
thread) and kills a worker that exceeds ``verifier.timeout``. Called from any
other thread, it turns math-verify's own timeouts off and relies on the
caller's bound.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Annotated, Any, ClassVar

from annotated_types import Ge

from scaffold_core.errors import require_module
from scaffold_core.plugins import Help
from scaffold_core.verifier import Reference, Verdict, Verifier, reference_answers

from .answers import GLUED_UNITS, VALUE_WORDS, AnswerError, answer_number, extract_answer, gold_answer, strip_emphasis

INSTALL = 'pip install "math-verify>=0.7" (what the math-verify extra of scaffold-gsm8k adds)'

# \text{...} and its kin hold words: their content is read as plain text.
_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox)\s*\{([^{}]*)\}")
_DELIMITERS = ("\\(", "\\)", "\\[", "\\]", "\\$", "$", "\\displaystyle")
_THOUSANDS_MARK = re.compile(r"(?<=\d)(?:\{,\}|\\,)(?=\d{3}(?!\d))")  # 1{,}000, 1\,000
_GROUPED = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])")  # 1,000,000 (a well-formed grouping)
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad(?![A-Za-z])|~")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Implicit juxtaposition: latex2sympy adds some number pairs as mixed numbers ("5 5", "5(5)", "5{5}" and
# "(5)(5)" all read 10) and multiplies others, so a value-like end followed by a value-like start, with no
# operator between, is refused. _OPENING_COMMANDS start a value; a "{" must open a command's argument.
_VALUE_END = frozenset("0123456789)]}!%") | {"\\}", "\\%", "\\circ", "\\rfloor", "\\rceil", "\\rvert", "\\rVert"}
_VALUE_START = frozenset("0123456789.([{") | {"\\{"}
_OPENING_COMMANDS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\sqrt", "\\left", "\\binom",
                               "\\dbinom", "\\tbinom", "\\lfloor", "\\lceil", "\\lvert", "\\vert"})
_LATEX_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[A-Za-z]+(?:['\u2019-][A-Za-z]+)*|\s+|.", re.DOTALL)
_QUOTES = frozenset("'\"\u2019\u201d")
_TRAILING_MARKS = frozenset(".,;:%\u00b0") | _QUOTES | {"\\%"}
_LEADING_MARKS = frozenset(":,")
_SEPARATORS = frozenset(",;:&")
# The LaTeX an answer may use: arithmetic, brackets, roots and a few functions. Any other command is refused.
_COMMANDS = frozenset("\\" + name for name in """
    frac dfrac tfrac cfrac sqrt cdot times div ast pm mp left right lfloor rfloor lceil rceil lvert rvert vert
    lVert rVert Vert pi infty circ binom dbinom tbinom log ln lg exp sin cos tan cot sec csc arcsin arccos arctan
    sinh cosh tanh mod bmod le ge leq geq lt gt neq ne % { } |
""".split())
_MALFORMED_DECIMAL = re.compile(r"\d*\.\d*\.")  # 5.5.5 (latex2sympy reads 5.5 * 0.5)


def _math_verify() -> Any:
    return require_module("math_verify", needed_by="the math_verify verifier", what="math-verify", install=INSTALL)


@functools.lru_cache(maxsize=1)
def _whole_boxed_config() -> tuple[Any, ...]:
    """math-verify extraction that reads only a ``\\boxed{}`` (taken whole), with no unit stripping."""
    mv = _math_verify()
    normalization = mv.LatexNormalizationConfig(basic_latex=True, units=False, malformed_operators=True,
                                                nits=True, boxed="last", equations=False)
    return (mv.LatexExtractionConfig(try_extract_without_anchor=False, boxed_match_priority=0,
                                     normalization_config=normalization),)


def _is_word(token: str) -> bool:
    return token[0].isascii() and token[0].isalpha()


def _unwrap_boxed(text: str) -> str:
    """``\\boxed{X}`` (the whole text) -> ``X``; a ``\\boxed`` anywhere else is refused."""
    text = text.strip()
    while (match := _BOXED.match(text)) is not None and text.endswith("}") and _balanced(text[match.end():-1]):
        text = text[match.end():-1].strip()
    if _BOXED.search(text):
        raise AnswerError("not one expression: a \\boxed{} inside it")
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def latex_answer(text: str) -> str:
    """The single LaTeX expression an answer region states, for math-verify to parse whole.

    Raises :class:`~scaffold_gsm8k.answers.AnswerError` when the region is not one expression.
    """
    at = text.rfind("=")
    if at > 0 and text[at - 1] in "<>!":
        raise AnswerError(f"not one expression: an inequality ({text[at - 1:at + 1]!r})")
    text = strip_emphasis(text[at + 1:])
    if "\\\\" in text:  # a line break: "5 \\ 6" would read 11
        raise AnswerError("not one expression: a line break ('\\\\')")
    text = _TEXT_GROUP.sub(lambda m: f" {m.group(1)} ", text)
    for delimiter in _DELIMITERS:
        text = text.replace(delimiter, " ")
    text = _THOUSANDS_MARK.sub(",", text)
    text = _GROUPED.sub(lambda m: m.group().replace(",", ""), _SPACING.sub(" ", text))
    if not _balanced(text):
        raise AnswerError("not one expression: unbalanced braces")
    text = _unwrap_boxed(text)
    if "_" in text:
        raise AnswerError("not one expression: a subscript")
    kept = _trimmed(_LATEX_TOKEN.findall(text))
    _check_kept(kept)
    latex = "".join(kept).strip()
    if not latex:
        raise AnswerError("not a number")
    if _MALFORMED_DECIMAL.search(latex):
        raise AnswerError("not one expression: a number with two decimal points")
    return latex


def _trimmed(tokens: list[str]) -> list[str]:
    """The tokens without a leading phrase ("The answer is") and a trailing unit ("dollars.", "km/h");
    AnswerError for a word that changes the value ("thousand")."""
    for token in tokens:
        if _is_word(token) and token.lower() in VALUE_WORDS:
            raise AnswerError(f"not a plain number: {token!r} changes its value")
    start, end = 0, len(tokens)
    while start < end:  # a leading phrase: "The answer is", "Total:"
        token = tokens[start]
        following = tokens[start + 1] if start + 1 < end else " "
        if token.isspace() or token in _LEADING_MARKS or (
                _is_word(token) and len(token) > 1 and (following.isspace() or following in _LEADING_MARKS)):
            start += 1
        else:
            break
    while end > start:  # a trailing unit and punctuation: "dollars.", "km/h", "%", "kg"
        token = tokens[end - 1]
        previous = tokens[end - 2] if end - 2 >= start else " "
        if token.isspace() or token in _TRAILING_MARKS or (token in "!?" and _is_word(previous) and len(previous) > 1):
            end -= 1
        elif _is_word(token) and len(token) > 1 and (previous.isspace() or previous == "/"):
            end -= 2 if previous == "/" else 1
        elif _is_word(token) and previous.isdigit() and token.lower() in GLUED_UNITS:
            end -= 1
        else:
            break
    return tokens[start:end]


def _check_kept(kept: list[str]) -> None:
    """Raise AnswerError when the remaining tokens are not one expression latex2sympy reads right."""
    for token in kept:
        if _is_word(token) and len(token) > 1:
            raise AnswerError(f"not one expression: words inside it ({token!r})")
        if token in _QUOTES:  # math-verify drops quotes, so 5'5 would read 55
            raise AnswerError(f"not one expression: a quote inside it ({token!r})")
        if token in _SEPARATORS:  # "5,5" would be the set {5} (or 5.5 in some locales), "5:30" a ratio
            raise AnswerError(f"not one expression: a list or ratio ({token!r} inside it)")
        if token.startswith("\\") and token not in _COMMANDS:
            # latex2sympy drops or misreads the others: "5\ldots5" and "5\phantom{5}" would read 10
            raise AnswerError(f"not one expression: LaTeX {token!r} is not read")
    problem = _structure_problem(kept)
    if problem:
        raise AnswerError(f"not one expression: {problem}")


def _structure_problem(tokens: list[str]) -> str | None:
    """Why ``tokens`` juxtapose two values ("5 5", "5(5)", "\\frac{1}{2}3") or open a bare "{" group, else None."""
    previous, spaced = "", False  # the last non-blank token; whether blanks followed it
    for token in tokens:
        if token.isspace():
            spaced = True
            continue
        argument_opens = (previous.startswith("\\") and previous[1:2].isalpha()) or previous in ("^", "}", "]")
        if token == "{" and not argument_opens:
            return "a bare '{' group"
        starts_value = token in _VALUE_START or token in _OPENING_COMMANDS
        if previous in _VALUE_END and starts_value:
            same_number = previous.isdigit() and token in "0123456789." and not spaced  # "55", "5.5"
            argument = previous in ("}", "]") and token == "{"  # the next argument: \\frac{1} {2}
            if not (same_number or argument):
                return f"{previous!r} and {token!r} side by side (write an operator between them)"
        previous, spaced = token, False
    return None


class MathVerifyVerifier(Verifier):
    """math-verify on the whole final answer (last '####', else last \\boxed{}): equality with the gold."""

    executor: ClassVar[str] = "process"

    def __init__(self, timeout_s: Annotated[int, Ge(1), Help("seconds per parse (math-verify counts whole ones)")] = 5,
                 max_answer_chars: Annotated[int, Ge(1), Help("a longer answer is refused")] = 1000,
                 float_rounding: int = 6):
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self.float_rounding = float_rounding

    def _timeout(self) -> int | None:
        return self.timeout_s if threading.current_thread() is threading.main_thread() else None

    def _parse(self, latex: str, timeout: int | None) -> list[Any]:
        """math-verify's reading of exactly ``latex`` ([] when it cannot parse it)."""
        return _math_verify().parse("\\boxed{" + latex + "}", extraction_config=_whole_boxed_config(),
                                    fallback_mode="no_fallback", extraction_mode="first_match",
                                    parsing_timeout=timeout)

    def _gold(self, reference: str, timeout: int | None) -> list[Any]:
        gold_text = gold_answer(reference)
        try:
            try:
                latex = answer_number(gold_text)
            except AnswerError:
                latex = latex_answer(gold_text)
        except AnswerError as exc:
            raise ValueError(f"reference answer {gold_text[:80]!r} is unusable ({exc})") from None
        gold = self._parse(latex, timeout)
        if not gold:
            raise ValueError(f"reference answer {gold_text[:80]!r} cannot be parsed by math-verify")
        return gold

    def verify(self, response: str, reference: Reference) -> Verdict:
        mv = _math_verify()
        answers = reference_answers(reference)  # one answer or a list of acceptable ones; raises for dicts
        if not answers:
            raise ValueError("no reference answer: the math_verify verifier needs the gold answer")
        timeout = self._timeout()
        golds = [self._gold(answer, timeout) for answer in answers]
        found = extract_answer(response or "")
        if not found.text:
            problem = found.problem or "no answer"
            return Verdict(0.0, found.text, None, f"no answer: {problem}")
        if len(found.text) > self.max_answer_chars:
            return Verdict(0.0, found.text, None,
                           f"no answer: the answer is longer than {self.max_answer_chars} characters")
        if found.key is not None:
            latex = found.key  # a plain number: its canonical value
        else:
            try:
                latex = latex_answer(found.text)
            except AnswerError as exc:
                return Verdict(0.0, found.text, None, f"no answer: the {found.source} answer is {exc}")
        parsed = self._parse(latex, timeout)
        if not parsed:
            return Verdict(0.0, found.text, None, f"no answer: math-verify cannot parse the {found.source} answer")
        key = found.key if found.key is not None else str(parsed[0])  # canonical numbers vote together
        ok = any(mv.verify(gold, parsed, float_rounding=self.float_rounding, timeout_seconds=timeout)
                 for gold in golds)
        return Verdict(1.0 if ok else 0.0, found.text, key,
                       f"correct ({found.source})" if ok else f"wrong answer ({found.source}): got {key[:40]}")
