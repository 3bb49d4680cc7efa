"""A small tool-using agent written against a plain OpenAI client: what `scaffold run`/`train` can train as is.

The agent knows nothing about scaffold. It asks the model, runs the calculator when the model calls
it, sends the result back, and returns the model's last answer. The `openai_agent` controller hands
it a client bound to a fresh session per episode (examples/openai-agent.yaml); the same function works
against any OpenAI-compatible server.
"""

from __future__ import annotations

import ast
import operator

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as '48 / 2 * 3'.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
SYSTEM = ("Solve the problem step by step. Use the calculator tool for arithmetic. "
          "End your answer with '#### <number>'.")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """+, -, *, / and parentheses over numbers; anything else is an error message for the model."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


async def solve(row: dict, client, max_turns: int = 4) -> str | None:
    """Answer ``row["question"]``; ``client`` is an ``openai.AsyncOpenAI``."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}]
    answer = None
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="scaffold", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = message.content
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            import json

            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return answer
