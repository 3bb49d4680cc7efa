"""The calculator tool: correct arithmetic, clean formatting, and refusals of everything but arithmetic."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from scaffold_core.errors import ConfigError
from scaffold_core.plugins.options import validate_options
from scaffold_core.tool import ToolContext, check_tool, invoke_tool
from scaffold_tools.calculator import CalculatorError, CalculatorTool, evaluate, format_number


def calc(expression: str, **options):
    tool = CalculatorTool(**options)
    return asyncio.run(invoke_tool(tool, {"expression": expression}, ToolContext("ep", "c1")))


@pytest.mark.parametrize("expression, expected", [
    ("1 + 2 * 3", "7"),
    ("(1 + 2) * 3", "9"),
    ("48 / 2 * 3", "72"),
    ("7 / 2", "3.5"),
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),
    ("7 % 3", "1"),
    ("2 ** 10", "1024"),
    ("2 ^ 10", "1024"),
    ("-3 ** 2", "-9"),
    ("+5 - -5", "10"),
    ("0.1 + 0.2", "0.3"),
    ("1 / 3", "0.333333333333"),
    ("10 / 4", "2.5"),
    ("6.0 * 2", "12"),
    ("1e3 + 1", "1001"),
    ("sqrt(16) + abs(-2)", "6"),
    ("round(2.567, 2)", "2.57"),
    ("round(7.5)", "8"),
    ("min(4, 2, 9) + max(1, 3)", "5"),
    ("max(7)", "7"),
    ("floor(2.7) + ceil(2.1)", "5"),
    ("log(e)", "1"),
    ("log(8, 2)", "3"),
    ("log10(1000)", "3"),
    ("2 * pi", "6.28318530718"),
    ("12345678901234567890 * 10", "123456789012345678900"),
    ("1e20", "1e+20"),
    ("-0.0", "0"),
    ("  3 + 4  ", "7"),
])
def test_arithmetic(expression, expected):
    result = calc(expression)
    assert result.ok, result.content
    assert result.content == expected


def test_value_is_kept_in_metadata():
    assert calc("2 ** 0.5").metadata["value"] == pytest.approx(math.sqrt(2))


@pytest.mark.parametrize("expression, fragment", [
    ("x + 1", "unknown name 'x'"),
    ("__import__('os')", "calling '__import__' is not allowed"),
    ("__import__('os').system('true')", "methods, attributes and other callables are not allowed"),
    ("(1).__class__", "attributes are not allowed"),
    ("math.sqrt(4)", "methods, attributes and other callables are not allowed"),
    ("(lambda: 1)()", "methods, attributes and other callables are not allowed"),
    ("lambda x: x", "lambdas are not allowed"),
    ("[x for x in range(3)]", "comprehensions are not allowed"),
    ("sum(i for i in range(10))", "calling 'sum' is not allowed"),
    ("'a' * 3", "only numbers are allowed"),
    ("True + 1", "only numbers are allowed"),
    ("1 < 2", "comparisons are not allowed"),
    ("1 if 2 else 3", "conditional expressions are not allowed"),
    ("(1, 2)", "tuples are not allowed"),
    ("1 << 3", "operator << is not supported"),
    ("~1", "operator ~ is not supported"),
    ("sqrt", "sqrt is a function"),
    ("sqrt(x=4)", "positional arguments only"),
    ("sqrt(1, 2)", "sqrt() takes 1 argument, got 2"),
    ("round(1, 2, 3)", "round() takes 1 to 2 arguments, got 3"),
    ("1 +", "cannot parse the expression"),
    ("import os", "cannot parse the expression"),
    ("", "the expression is empty"),
])
def test_refusals_are_bad_arguments(expression, fragment):
    result = calc(expression)
    assert not result.ok and result.error == "bad_arguments", result.content
    assert fragment in result.content


@pytest.mark.parametrize("expression, fragment", [
    ("9 ** 9 ** 9", "exponent"),
    ("2 ** 100000", "exponent 100000 is too large"),
    ("10 ** 1000", "would have 1001 digits"),
    ("(10 ** 600) * (10 ** 600)", "more than 1000 digits"),
    ("1" * 1001, "characters long"),
    ("(" * 300 + "1" + ")" * 300, "nested"),
])
def test_huge_work_is_refused_quickly_as_a_limit(expression, fragment):
    start = time.monotonic()
    result = calc(expression)
    assert time.monotonic() - start < 2
    assert not result.ok and result.error == "limit", result.content
    assert fragment in result.content


@pytest.mark.parametrize("expression, fragment", [
    ("1 / 0", "division by zero"),
    ("5 // 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("sqrt(-1)", "math domain error"),
    ("log(0)", "math domain error"),
    ("10.0 ** 400", "too large"),
    ("exp(1000)", "too large"),
    ("(-8) ** 0.5", "not a real number"),
    ("10 ** 400 / 3", "too large"),
])
def test_math_errors_are_failed_results(expression, fragment):
    result = calc(expression)
    assert not result.ok and result.error == "failed", result.content
    assert fragment in result.content


def test_large_but_allowed_results():
    assert calc("9 ** 999").content == str(9 ** 999)
    assert calc("(-1) ** 1000001").content == "-1"
    assert calc("10 ** 999").content == "1" + "0" * 999  # 1000 digits: exactly at the limit
    assert calc("10 ** 999 * 10").error == "limit"


def test_limits_are_options():
    assert calc("2 ** 20", max_exponent=10).error == "limit"
    assert calc("1 + 1 + 1", max_length=4).error == "limit"
    assert calc("10 ** 30", max_digits=20).error == "limit"
    assert calc("1 / 3", precision=3).content == "0.333"


def test_options_are_checked():
    with pytest.raises(ConfigError, match=r"tools\.calculator\.max_digits: Input should be less than or equal to 4000; "
                                          r"got 10000 .*max_digits: int \(>= 1, <= 4000\) = 1000"):
        validate_options(CalculatorTool, {"max_digits": 10_000}, path="tools.calculator", label="tool 'calculator'")
    with pytest.raises(ConfigError, match=r"tools\.calculator\.max_length: Input should be greater than or equal to 1"):
        validate_options(CalculatorTool, {"max_length": 0}, path="tools.calculator", label="tool 'calculator'")


def test_wrong_argument_types_are_caught_by_the_schema():
    tool = CalculatorTool()
    result = asyncio.run(invoke_tool(tool, {"expression": 42}, ToolContext("ep", "c")))
    assert result.error == "bad_arguments" and "42 is not of type 'string'" in result.content
    result = asyncio.run(invoke_tool(tool, {"expr": "1+1"}, ToolContext("ep", "c")))
    assert result.error == "bad_arguments" and "'expression' is a required property" in result.content


def test_format_number():
    assert format_number(3.0) == "3"
    assert format_number(2.5) == "2.5"
    assert format_number(1e16) == "1e+16"
    assert format_number(-0.0) == "0"
    assert format_number(10 ** 20) == "100000000000000000000"


def test_evaluate_raises_calculator_error_with_a_kind():
    with pytest.raises(CalculatorError) as info:
        evaluate("1/0")
    assert info.value.kind == "failed"


def test_definition_is_valid():
    check_tool(CalculatorTool())
    assert CalculatorTool().spec()["function"]["parameters"]["required"] == ["expression"]


def test_a_lone_surrogate_is_reported_as_what_it_is():
    """JSON's "\\ud800" escape decodes to half of a UTF-16 pair: not a nesting problem, not a crash."""
    result = asyncio.run(invoke_tool(CalculatorTool(), '{"expression": "1 + \\ud800"}', ToolContext("ep", "c")))
    assert result.error == "bad_arguments"
    assert "lone surrogate ('\\ud800' at character 4)" in result.content and "nested" not in result.content
    nul = asyncio.run(invoke_tool(CalculatorTool(), {"expression": "1 + \x00"}, ToolContext("ep", "c")))
    assert nul.error == "bad_arguments" and "cannot parse the expression" in nul.content
