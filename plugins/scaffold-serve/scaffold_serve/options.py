"""The options every agent-running controller shares, declared once (validated and listed from these)."""

from __future__ import annotations

from typing import Annotated, Literal

from annotated_types import Ge, Gt

from scaffold_core.plugins import Help

AgentTimeout = Annotated[float, Gt(0), Help("seconds one agent run may take")]
AgentSampling = Annotated[Literal["config", "request"],
                          Help("config: the run's sampling section decides; request: the client's parameters win")]
MaxCalls = Annotated[int, Ge(1), Help("chat calls one episode may make")]
ContextLength = Annotated[int, Ge(2), Help("longer prompts get a 400 context_length_exceeded (null: the tokenizer's)")]
