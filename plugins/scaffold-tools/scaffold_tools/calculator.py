"""The ``calculator`` tool: arithmetic on an expression, by parsing it (never ``eval``).

The expression is parsed with :mod:`ast` and only a whitelist is evaluated: int and float
literals; ``+ - * / // % **``; unary ``+``/``-``; parentheses; the constants ``pi``, ``e`` and
``tau``; and the functions in :data:`FUNCTIONS`. Everything else (names, attribute access, calls
of anything else, lambdas, comprehensions, strings, comparisons) is refused. Work is bounded: the
expression's length, the size of integers (in digits), and exponents are checked before they are
computed, so ``9**9**9`` is refused instead of hanging the event loop.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le

from scaffold_core.plugins import Help
from scaffold_core.tool import Tool, ToolCallError, ToolContext, ToolResult

Number = int | float

#: The largest ``max_digits`` allowed: below Python's limit on converting integers to text (4300 digits).
MAX_DIGITS_LIMIT = 4000

#: Constants an expression may name.
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise TypeError("round(x, ndigits): ndigits must be an integer")
    return round(x, ndigits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


#: Functions an expression may call: name -> (function, min args, max args or None).
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None]] = {
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (lambda *args: min(args), 1, None),
    "max": (lambda *args: max(args), 1, None),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (_log, 1, 2),
    "log10": (math.log10, 1, 1),
}

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

_DESCRIBE: dict[type, str] = {
    ast.Attribute: "attributes",
    ast.Lambda: "lambdas",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.Subscript: "subscripts",
    ast.Compare: "comparisons",
    ast.BoolOp: "boolean operators",
    ast.IfExp: "conditional expressions",
    ast.NamedExpr: "assignments",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Dict: "dicts",
    ast.Set: "sets",
    ast.JoinedStr: "strings",
    ast.Starred: "starred arguments",
    ast.Await: "await expressions",
    ast.Yield: "yield expressions",
    ast.YieldFrom: "yield expressions",
}


class CalculatorError(Exception):
    """Why an expression was refused or could not be evaluated; ``kind`` is a ToolResult error kind."""

    def __init__(self, message: str, kind: str = "bad_arguments"):
        super().__init__(message)
        self.kind = kind


class _Evaluator:
    def __init__(self, max_digits: int, max_exponent: int):
        self.max_digits = max_digits
        self.max_exponent = max_exponent
        # An int with at most this many bits has at most max_digits decimal digits.
        self.safe_bits = math.floor(max_digits * math.log2(10))

    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CalculatorError(f"only numbers are allowed, not {type(value).__name__} {value!r}")
            return self.check(value)
        if isinstance(node, ast.BinOp):
            op = _BINARY.get(type(node.op))
            if op is None:
                raise CalculatorError(f"operator {_op_text(node.op)} is not supported; use + - * / // % **")
            left, right = self.eval(node.left), self.eval(node.right)
            if isinstance(node.op, ast.Pow):
                self.check_power(left, right)
            return self.check(op(left, right))
        if isinstance(node, ast.UnaryOp):
            unary = _UNARY.get(type(node.op))
            if unary is None:
                raise CalculatorError(f"operator {_op_text(node.op)} is not supported; use + or - in front of a number")
            return self.check(unary(self.eval(node.operand)))
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return CONSTANTS[node.id]
            if node.id in FUNCTIONS:
                raise CalculatorError(f"{node.id} is a function: call it, e.g. {node.id}(2)")
            raise CalculatorError(
                f"unknown name {node.id!r}: only numbers, the constants {', '.join(CONSTANTS)} and the "
                f"functions {', '.join(FUNCTIONS)} are allowed; substitute values for variables")
        if isinstance(node, ast.Call):
            return self.call(node)
        what = _DESCRIBE.get(type(node), f"{type(node).__name__} expressions")
        raise CalculatorError(f"{what} are not allowed in a calculator expression")

    def call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name):
            raise CalculatorError(f"only the functions {', '.join(FUNCTIONS)} may be called, by name; "
                                  "methods, attributes and other callables are not allowed")
        if node.func.id not in FUNCTIONS:
            raise CalculatorError(f"calling {node.func.id!r} is not allowed; functions: {', '.join(FUNCTIONS)}")
        name = node.func.id
        fn, low, high = FUNCTIONS[name]
        if node.keywords:
            raise CalculatorError(f"{name}() takes positional arguments only")
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise CalculatorError("starred arguments are not allowed in a calculator expression")
        count = len(node.args)
        if count < low or (high is not None and count > high):
            wanted = f"{low}" if low == high else f"{low} or more" if high is None else f"{low} to {high}"
            raise CalculatorError(f"{name}() takes {wanted} argument{'s' if wanted != '1' else ''}, got {count}")
        args = [self.eval(arg) for arg in node.args]
        if name == "round" and len(args) == 2 and isinstance(args[1], int) and abs(args[1]) > self.max_digits:
            raise CalculatorError(f"round(): ndigits must be at most {self.max_digits} in size", kind="limit")
        return self.check(fn(*args))

    def check_power(self, base: Number, exponent: Number) -> None:
        if isinstance(exponent, int) and abs(exponent) > self.max_exponent and abs(base) not in (0, 1):
            raise CalculatorError(
                f"exponent {exponent} is too large (the limit is {self.max_exponent})", kind="limit")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            digits = math.floor(exponent * math.log10(abs(base))) + 1
            if digits > self.max_digits:
                raise CalculatorError(
                    f"the result of {_short(base)} ** {exponent} would have {digits} digits "
                    f"(the limit is {self.max_digits})", kind="limit")

    def check(self, value: Any) -> Number:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"the result is not a real number ({type(value).__name__})", kind="failed")
        if isinstance(value, int) and value.bit_length() > self.safe_bits and (
                value.bit_length() > self.safe_bits + 4 or len(str(abs(value))) > self.max_digits):
            raise CalculatorError(f"an intermediate result has more than {self.max_digits} digits", kind="limit")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("the result is not a finite number (overflow)", kind="failed")
        return value


def _op_text(op: ast.AST) -> str:
    return {
        ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
        ast.MatMult: "@", ast.Invert: "~", ast.Not: "not",
    }.get(type(op), type(op).__name__)


def _short(value: Number) -> str:
    text = str(value)
    return text if len(text) <= 20 else text[:17] + "..."


def evaluate(expression: str, *, max_length: int = 1000, max_digits: int = 1000,
             max_exponent: int = 10_000) -> Number:
    """Evaluate an arithmetic expression; raise :class:`CalculatorError` on refusal or failure."""
    text = expression.strip()
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > max_length:
        raise CalculatorError(f"the expression is {len(text)} characters long (the limit is {max_length})",
                              kind="limit")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON's "\ud800" escape gives one; it is half a character, not text
        raise CalculatorError(f"the expression contains a lone surrogate ({text[exc.start]!r} at character "
                              f"{exc.start}), half of a UTF-16 pair and not a character; write plain "
                              "arithmetic") from None
    text = text.replace("^", "**")  # models often write powers as ^ (bitwise xor is not supported anyway)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg):
            raise CalculatorError("the expression is too deeply nested", kind="limit") from None
        raise CalculatorError(f"cannot parse the expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise CalculatorError("the expression is too deeply nested", kind="limit") from None
    except ValueError as exc:  # e.g. a NUL character
        raise CalculatorError(f"cannot parse the expression: {exc}") from None
    try:
        return _Evaluator(max_digits, max_exponent).eval(tree)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero", kind="failed") from None
    except OverflowError:
        raise CalculatorError("the result is too large (overflow)", kind="failed") from None
    except RecursionError:
        raise CalculatorError("the expression is too deeply nested", kind="limit") from None
    except (ValueError, TypeError) as exc:
        raise CalculatorError(f"math error: {exc}", kind="failed") from None


def format_number(value: Number, *, precision: int = 12) -> str:
    """Integers as integers (``3.0`` -> ``3``); floats to ``precision`` significant digits."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        text = f"{value:.{precision}g}"
        return "0" if text in ("-0", "0") else text
    return str(value)


class CalculatorTool(Tool):
    """Evaluates arithmetic expressions safely (a parser with a whitelist; never eval)."""

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression and return its value. Supports numbers, + - * / // % ** "
        "(or ^ for powers), parentheses, the constants pi, e and tau, and the functions "
        + ", ".join(FUNCTIONS) + ". Variables are not supported: substitute numbers."
    )
    parameters = {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "description": "The expression to evaluate, e.g. \"(48 / 2) * 3 + sqrt(16)\".",
            },
        },
        "required": ["expression"],
        "additionalProperties": False,
    }

    def __init__(self, max_length: Annotated[int, Ge(1), Help("characters of an expression")] = 1000,
                 max_digits: Annotated[int, Ge(1), Le(MAX_DIGITS_LIMIT),
                                       Help("digits of an integer (Python prints no longer ones)")] = 1000,
                 max_exponent: Annotated[int, Ge(1), Help("largest exponent of a power")] = 10_000,
                 precision: Annotated[int, Ge(1), Help("significant digits of a float result (17 at most)")] = 12,
                 timeout: Annotated[float, Gt(0), Help("seconds one call may take")] = 5.0):
        self.max_length = max_length
        self.max_digits = max_digits
        self.max_exponent = max_exponent
        self.precision = min(precision, 17)
        self.timeout = timeout

    async def call(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        expression = arguments["expression"]
        try:
            value = evaluate(expression, max_length=self.max_length, max_digits=self.max_digits,
                             max_exponent=self.max_exponent)
        except CalculatorError as exc:
            raise ToolCallError(f"calculator: {exc}", kind=exc.kind) from None
        return ToolResult(content=format_number(value, precision=self.precision), metadata={"value": value})
