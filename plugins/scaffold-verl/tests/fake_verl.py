"""A faithful stand-in for the parts of verl scaffold-verl touches (verl itself is too heavy for CI).

Reproduced from verl's sources (verl-project/verl at 1dda039b):

* ``AgentLoopMetrics``, ``AgentLoopOutput`` (pydantic models, the same
  fields and defaults), ``AgentLoopBase`` (the constructor's keyword
  arguments and the attributes it sets, ``ct_build_initial_tokens``:
  chat template with ``apply_chat_template_kwargs``, left-truncated to
  ``prompt_length``), ``register`` and its registry
  (``verl/experimental/agent_loop/agent_loop.py``);
* ``TokenOutput`` (``verl/workers/rollout/replica.py``);
* ``FakeServerManager.generate``: ``LLMServerClient.generate``'s signature
  and result, over a scripted server that behaves like verl's vLLM server
  (``completed``/``aborted``, ``max_tokens``) or its SGLang server
  (``stop``/``length``/``abort``, ``max_new_tokens``): the default budget
  ``min(response_length, prompt_length + response_length - len(prompt_ids))``,
  log probs only when ``sampling_params["logprobs"]`` is true, the sampling
  dict consumed (popped) by the server, ``extra_fields`` with
  ``global_steps`` and the ``min``/``max`` defaults the client adds;
* ``AgentLoopWorker``'s use of a loop: instantiate the registered
  ``_target_`` with verl's keyword arguments plus the YAML entry's keys
  (``name`` included), await ``run(sampling_params, **row)``, then pad as
  ``_agent_loop_postprocess`` does (which fails on over-long outputs).
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

# -- verl/workers/rollout/replica.py -----------------------------------------------


class TokenOutput(BaseModel):
    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any | None = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = {}


# -- verl/experimental/agent_loop/agent_loop.py ------------------------------------


class AgentLoopMetrics(BaseModel):
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}
    mm_processor_kwargs: dict[str, Any] | None = None


class Config(dict):
    """An OmegaConf-like config: attribute access and ``get``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


class DictConfigWrap:
    def __init__(self, config: Any):
        self.config = config


class ToolListWrap:
    def __init__(self, tools: list):
        self.tools = tools


class AgentLoopBase(ABC):
    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any,
                 dataset_cls: type, data_config: DictConfigWrap, hf_model_type: str | None = None, **kwargs: Any):
        self.config = trainer_config.config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.data_config = data_config.config
        self.apply_chat_template_kwargs = self.data_config.get("apply_chat_template_kwargs", {})
        self.mm_processor_kwargs = self.data_config.get("mm_processor_kwargs", {})
        self.loop = asyncio.get_event_loop()

    async def ct_build_initial_tokens(self, messages: list[dict], tools: list[dict] | None = None, images=None,
                                      videos=None, audios=None) -> list[int]:
        prompt_ids = await self.loop.run_in_executor(None, lambda: self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs))
        prompt_length = self.rollout_config.prompt_length
        return prompt_ids[-prompt_length:] if len(prompt_ids) > prompt_length else prompt_ids

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        raise NotImplementedError


_agent_loop_registry: dict[str, dict] = {}


def register(agent_name: str) -> Callable[[type], type]:
    def decorator(subclass: type) -> type:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator


def api() -> Any:
    from scaffold_verl.api import VerlAPI

    return VerlAPI(AgentLoopBase=AgentLoopBase, AgentLoopOutput=AgentLoopOutput, register=register)


def fake_classes() -> SimpleNamespace:
    return SimpleNamespace(AgentLoopBase=AgentLoopBase, AgentLoopOutput=AgentLoopOutput, TokenOutput=TokenOutput,
                           DictConfigWrap=DictConfigWrap, ToolListWrap=ToolListWrap, register=register,
                           registry=_agent_loop_registry)


def real_classes() -> SimpleNamespace:
    from verl.experimental.agent_loop import agent_loop as al
    from verl.workers.rollout.replica import TokenOutput as T

    return SimpleNamespace(AgentLoopBase=al.AgentLoopBase, AgentLoopOutput=al.AgentLoopOutput, TokenOutput=T,
                           DictConfigWrap=al.DictConfigWrap, ToolListWrap=al.ToolListWrap, register=al.register,
                           registry=al._agent_loop_registry)


# -- the server manager ----------------------------------------------------------


def token_logprob(token: int, position: int, step: int) -> float:
    """The fake policy's logprob of ``token`` at ``position`` under weights ``step`` (finite, negative)."""
    return -0.05 - ((token * 17 + position * 5 + step * 11) % 89) / 100.0


class FakeServerManager:
    """``LLMServerClient`` over a scripted server: ``respond(prompt_ids) -> token ids`` of the whole answer.

    ``backend``: ``"vllm"`` or ``"sglang"`` (how stop reasons and the budget key look).
    ``abort_after``: ``{call index: tokens}``: that call is aborted after so many tokens (a weight
    sync), and ``global_steps`` moves to ``step_after_abort``.
    """

    def __init__(self, respond: Callable[[list[int]], list[int]], *, eos_token_id: int, prompt_length: int,
                 response_length: int, backend: str = "vllm", classes: SimpleNamespace | None = None,
                 abort_after: dict[int, int] | None = None, step_after_abort: int = 1, global_steps: int = 0):
        self.respond = respond
        self.eos_token_id = eos_token_id
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.backend = backend
        self.classes = classes or fake_classes()
        self.abort_after = dict(abort_after or {})
        self.step_after_abort = step_after_abort
        self.global_steps = global_steps
        self.calls: list[dict[str, Any]] = []
        self._continuations: dict[tuple[int, ...], list[int]] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, **kwargs: Any) -> Any:
        index = len(self.calls)
        call = {"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params),
                "kwargs": kwargs, "global_steps": self.global_steps}
        self.calls.append(call)
        params = sampling_params  # the server consumes the dict it is given
        first, second = ("max_tokens", "max_new_tokens") if self.backend == "vllm" else ("max_new_tokens",
                                                                                          "max_tokens")
        if first in params:
            budget = params.pop(first)
        elif second in params:
            budget = params.pop(second)
        else:
            budget = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        budget = max(1 if self.backend == "vllm" else 0, budget)
        want_logprobs = bool(params.pop("logprobs", False))
        stop_ids = set(params.get("stop_token_ids") or ())
        planned = self._continuations.pop(tuple(prompt_ids), None) or list(self.respond(list(prompt_ids)))
        step = self.global_steps
        cut_at = self.abort_after.get(index)
        out: list[int] = []
        reason = "length"
        while len(out) < budget:
            await asyncio.sleep(0)
            if cut_at is not None and len(out) >= cut_at:
                reason = "abort"
                break
            if len(out) >= len(planned):
                reason = "stop"
                break
            out.append(planned[len(out)])
            if out[-1] == self.eos_token_id or out[-1] in stop_ids:
                reason = "stop"
                break
        if reason == "abort" or (reason == "length" and len(out) < len(planned)):
            self._continuations[tuple(prompt_ids) + tuple(out)] = planned[len(out):]
        if reason == "abort":
            self.global_steps = self.step_after_abort
        logprobs = [token_logprob(t, len(prompt_ids) + i, step) for i, t in enumerate(out)]
        if self.backend == "vllm":
            stop_reason = {"stop": "completed", "length": "completed", "abort": "aborted"}[reason]
        else:
            stop_reason = reason
        call.update(output=list(out), stop_reason=stop_reason)
        extra = {"global_steps": step}
        extra.setdefault("min_global_steps", step)
        extra.setdefault("max_global_steps", step)
        return self.classes.TokenOutput(token_ids=out, log_probs=logprobs if want_logprobs else None,
                                        stop_reason=stop_reason, num_preempted=0 if self.backend == "vllm" else None,
                                        extra_fields=extra)


# -- the worker ----------------------------------------------------------------------


def trainer_config(prompt_length: int, response_length: int, apply_chat_template_kwargs: dict | None = None) -> Any:
    rollout = Config(prompt_length=prompt_length, response_length=response_length, name="vllm",
                     calculate_log_probs=True, full_determinism=False)
    data = Config(apply_chat_template_kwargs=apply_chat_template_kwargs or {}, max_prompt_length=prompt_length,
                  max_response_length=response_length)
    return Config(actor_rollout_ref=Config(rollout=rollout), data=data)


def resolve(target: str) -> type:
    """What hydra does with ``_target_``: import the module, walk the attribute path."""
    module_name, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def instantiate(classes: SimpleNamespace, entry: dict[str, Any], *, server: Any, tokenizer: Any,
                config: Any, target_cls: type | None = None) -> Any:
    """``hydra.utils.instantiate(entry, **verl's kwargs)`` as ``AgentLoopWorker._run_agent_loop`` calls it."""
    options = {k: v for k, v in entry.items() if k != "_target_"}
    cls = target_cls or resolve(entry["_target_"])
    return cls(trainer_config=classes.DictConfigWrap(config=config), server_manager=server, tokenizer=tokenizer,
               processor=None, hf_model_type=None, dataset_cls=object,
               data_config=classes.DictConfigWrap(config.data), tools=classes.ToolListWrap([]), **options)


def postprocess(output: Any, *, prompt_length: int, response_length: int, pad_token_id: int) -> dict[str, Any]:
    """``_agent_loop_postprocess``'s padding: left-pad prompts, right-pad responses (it never truncates)."""
    import torch

    assert len(output.prompt_ids) <= prompt_length, "prompt longer than prompt_length: verl's batch would be ragged"
    assert len(output.response_ids) <= response_length, "response longer than response_length: ragged batch"
    assert len(output.response_mask) == len(output.response_ids)
    n = len(output.response_ids)
    prompts = [pad_token_id] * (prompt_length - len(output.prompt_ids)) + list(output.prompt_ids)
    responses = list(output.response_ids) + [pad_token_id] * (response_length - n)
    out = {"prompts": torch.tensor([prompts]), "responses": torch.tensor([responses]),
           "response_mask": torch.tensor([list(output.response_mask) + [0] * (response_length - n)])}
    if output.response_logprobs is not None:
        assert len(output.response_logprobs) == n
        out["rollout_log_probs"] = torch.tensor([list(output.response_logprobs) + [0.0] * (response_length - n)],
                                                dtype=torch.float32)
    return out
