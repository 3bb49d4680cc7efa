"""Forced tool calls and structured output as a grammar: the :class:`~scaffold_core.sampling.Constraint` of a call.

* ``tool_choice: required`` (Anthropic: ``any``) or a named function (``tool``): the
  output must be one call in the tool-call format's own syntax, ``<tool_call>\\n{"name":
  ..., "arguments": {...}}\\n</tool_call>``, naming one of the allowed tools, its
  arguments valid against that tool's JSON Schema; then the end of the turn. As an
  xgrammar structural tag (a fixed text, a JSON Schema with at most one whitespace
  character in a row, a fixed text), which SGLang takes as its native
  ``structural_tag`` parameter too (an SGLang whose xgrammar predates
  ``max_whitespace_cnt`` refuses it).
* ``response_format`` ``json_schema`` (the Responses API's ``text.format``): the whole
  answer is JSON valid against the schema; ``json_object``: any JSON object.

The engine decodes under the grammar (the embedded engine with xgrammar, SGLang with
its own grammar backend): the tokens are recorded exactly as sampled, with the
logprobs of the distribution the grammar left (see docs/serve.md). An engine that
cannot constrain answers one 400 (:func:`check_engine`).
"""

from __future__ import annotations

import json
from typing import Any

from scaffold_core.sampling import Constraint

from .render import call_tag
from .wire import ChatRequest, WireError

#: A JSON object with any members: what ``json_object`` asks for.
ANY_OBJECT = {"type": "object", "additionalProperties": True}


def constraint_for(request: ChatRequest, fmt: Any) -> Constraint | None:
    """The grammar a call must be decoded under, or ``None`` for free text."""
    if request.forced_tool:
        return tool_call_constraint(request, fmt)
    if request.response_format is not None:
        schema = request.response_format.get("schema", ANY_OBJECT)
        return Constraint("json_schema", json.dumps(schema, sort_keys=True),
                          f"response_format: {request.response_format['type']}")
    return None


def tool_call_constraint(request: ChatRequest, fmt: Any) -> Constraint:
    choice = request.tool_choice
    tools = [t["function"] for t in request.tools]
    if isinstance(choice, dict):
        tools = [t for t in tools if t["name"] == choice["name"]]
    calls = [{"type": "object", "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    tag = call_tag(fmt)
    structure = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": f"<{tag}>\n"},
        {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1},
        {"type": "const_string", "value": f"\n</{tag}>"},
    ]}}
    reason = f"tool_choice: {choice['name']}" if isinstance(choice, dict) else "tool_choice: required"
    # the schema's key order is the order the grammar wants ("name" first, as the formats write calls): not sorted
    return Constraint("structural_tag", json.dumps(structure), reason)


def check_engine(constraint: Constraint | None, engine: Any, name: str) -> None:
    """A 400 when ``engine`` cannot enforce ``constraint`` (never generated unconstrained as if it were)."""
    if constraint is None or engine is None or constraint.kind in getattr(engine, "constraints", frozenset()):
        return
    raise WireError(400, f"{constraint.reason} needs grammar-constrained decoding, which the engine {name!r} cannot "
                         "do; leave it out (tool_choice: auto, no response_format), or serve an engine that can: "
                         "transformers (with xgrammar installed) or sglang", param=constraint.reason.split(":")[0],
                    code="constraint_unsupported")
