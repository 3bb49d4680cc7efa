"""A faithful stand-in for the parts of AReaL scaffold-areal touches (AReaL itself is too heavy for CI).

Reproduced from AReaL's sources (areal-project/AReaL at cbff54d6):

* ``GenerationHyperparameters``, ``ModelRequest``, ``ModelResponse``,
  ``HttpGenerationResult`` (``areal/api/cli_args.py``, ``io_struct.py``):
  the same fields, defaults and methods the adapter relies on;
* ``RolloutWorkflow`` (``areal/api/workflow_api.py``): one abstract method;
* ``FakeInferenceEngine.agenerate``: ``RemoteInfEngine.agenerate``'s
  algorithm step for step: copy the request, reject ``n_samples != 1``,
  cap ``max_new_tokens`` by ``max_tokens - len(input_ids)`` (RuntimeError
  when nothing is left), then loop: wait while paused, pin the version,
  send one segment, extend tokens/logprobs/versions, resubmit prompt +
  partial output with the remaining budget while the server aborts; an
  ``abort`` left when the budget ran out is reported as ``length``;
* ``concat_padded_tensors`` (``areal/utils/data.py``): how AReaL joins episodes.

The "server" behind it generates scripted token ids one at a time (yielding
to the event loop between tokens), honours ``stop_token_ids``, EOS and the
token budget, gives each token a logprob that depends on the token, its
position and the weight version, and is aborted by a weight update exactly
as SGLang's ``pause_generation`` aborts in-flight requests (partial output,
``abort``). An aborted response continues where it stopped when resubmitted.
"""

from __future__ import annotations

import asyncio
import copy
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

# -- areal/api/cli_args.py -------------------------------------------------------


@dataclass
class GenerationHyperparameters:
    n_samples: int = 1
    max_new_tokens: int = 16384
    min_new_tokens: int = 0
    max_tokens: int = 32768
    greedy: bool = False
    top_p: float = 1.0
    top_k: int = int(1e8)
    temperature: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop: list[str] | None = None
    frequency_penalty: float = 0.0
    seed: int | None = None
    lora_name: str = "default_lora"
    use_beam_search: bool = False
    reward_normalization: bool = False
    drop_incomplete_group: bool = False

    def new(self, **kwargs: Any) -> GenerationHyperparameters:
        args = asdict(self)
        args.update(kwargs)
        return GenerationHyperparameters(**args)

    def new_with_stop_and_pad_token_ids(self, tokenizer: Any) -> GenerationHyperparameters:
        stop_token_ids = list(self.stop_token_ids)
        if tokenizer.pad_token_id not in stop_token_ids:
            stop_token_ids.append(tokenizer.pad_token_id)
        if tokenizer.eos_token_id not in stop_token_ids:
            stop_token_ids.append(tokenizer.eos_token_id)
        return self.new(stop_token_ids=stop_token_ids)


# -- areal/api/io_struct.py -------------------------------------------------------


@dataclass
class ModelRequest:
    rid: str = field(default_factory=lambda: str(uuid.uuid4()))
    input_ids: list[int] = field(default_factory=list)
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    metadata: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    image_data: list[str] | None = field(default_factory=list)
    processor: Any = None
    vision_msg_vllm: list | None = None

    def copy(self) -> ModelRequest:
        return ModelRequest(
            rid=self.rid, input_ids=self.input_ids.copy(), gconfig=self.gconfig.new(),
            metadata=self.metadata.copy(), tokenizer=self.tokenizer,
            image_data=self.image_data.copy() if self.image_data is not None else None,
            processor=self.processor,
            vision_msg_vllm=self.vision_msg_vllm.copy() if self.vision_msg_vllm is not None else None,
        )


@dataclass
class ModelResponse:
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    stop_reason: Literal["length", "stop", "tool_calls", "abort"] = "stop"
    tokenizer: Any = None
    input_images: list[Any] = field(default_factory=list)
    processor: Any = None
    latency: float = float("inf")
    ttft: float = float("inf")
    itl: list[float] = field(default_factory=list)
    routed_experts: Any = None

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)


@dataclass
class HttpGenerationResult:
    output_tokens: list[int]
    output_logprobs: list[float]
    stop_reason: str
    routed_experts: Any = None

    def __post_init__(self) -> None:
        if len(self.output_tokens) != len(self.output_logprobs):
            raise ValueError("output_tokens and output_logprobs differ in length")
        for lp in self.output_logprobs:
            if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
                raise ValueError(f"logprob {lp!r} is not a finite real number")


# -- areal/api/workflow_api.py ----------------------------------------------------


class RolloutWorkflow(ABC):
    @abstractmethod
    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        raise NotImplementedError()


def api(turn_ids: bool = True) -> Any:
    """This module's classes in the shape of :class:`scaffold_areal.api.ArealAPI`."""
    from scaffold_areal.api import ArealAPI

    return ArealAPI(RolloutWorkflow=RolloutWorkflow, ModelRequest=ModelRequest,
                    GenerationHyperparameters=GenerationHyperparameters, turn_ids=turn_ids)


def real_classes() -> SimpleNamespace:
    """The same names from the installed AReaL (the caller skips when it is absent)."""
    from areal.api.cli_args import GenerationHyperparameters as G
    from areal.api.io_struct import HttpGenerationResult as H
    from areal.api.io_struct import ModelRequest as Q
    from areal.api.io_struct import ModelResponse as R
    from areal.api.workflow_api import RolloutWorkflow as W

    return SimpleNamespace(GenerationHyperparameters=G, ModelRequest=Q, ModelResponse=R, HttpGenerationResult=H,
                           RolloutWorkflow=W)


def fake_classes() -> SimpleNamespace:
    return SimpleNamespace(GenerationHyperparameters=GenerationHyperparameters, ModelRequest=ModelRequest,
                           ModelResponse=ModelResponse, HttpGenerationResult=HttpGenerationResult,
                           RolloutWorkflow=RolloutWorkflow)


# -- the server and RemoteInfEngine.agenerate --------------------------------------


def token_logprob(token: int, position: int, version: int) -> float:
    """The fake policy's logprob of ``token`` at ``position`` under weights ``version`` (finite, negative)."""
    return -0.05 - ((token * 31 + position * 7 + version * 13) % 97) / 100.0


@dataclass
class Segment:
    """One HTTP generation request the server received (what the test can inspect)."""

    input_ids: list[int]
    sampling: dict[str, Any]
    version: int
    output: list[int] = field(default_factory=list)
    stop_reason: str = ""
    aborted: bool = False


class FakeInferenceEngine:
    """``RemoteInfEngine`` with a scripted server: ``respond(prompt_ids) -> token ids`` of the whole answer.

    ``eos_token_id`` ends a response (``stop``) unless ``ignore_eos``.
    ``updates``: ``{tokens_generated_so_far: new_version}``; when the server
    has generated that many tokens in total, a weight update happens: the
    rollout is paused, every in-flight segment is aborted with its partial
    output, the version is set, and generation resumes shortly after.
    """

    def __init__(self, respond: Callable[[list[int]], list[int]], *, eos_token_id: int,
                 classes: SimpleNamespace | None = None, updates: dict[int, int] | None = None,
                 pause_poll_s: float = 0.001):
        self.respond = respond
        self.eos_token_id = eos_token_id
        self.classes = classes or fake_classes()
        self.updates = dict(updates or {})
        self.pause_poll_s = pause_poll_s
        self._version = 0
        self._paused = False
        self.requests: list[Any] = []  # the ModelRequest objects agenerate received (not copies)
        self.request_copies: list[Any] = []  # deep copies taken on arrival (to check nobody changed them)
        self.segments: list[Segment] = []
        self.generated = 0
        self._inflight: set[int] = set()
        self._continuations: dict[tuple[int, ...], list[int]] = {}

    # versions and pausing (RemoteInfEngine / WorkflowExecutor)
    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def is_paused(self) -> bool:
        return self._paused

    async def update_weights(self, version: int) -> None:
        """A weight update as AReaL's trainer does it: pause, abort in flight, set version, resume."""
        self.pause()
        for index in list(self._inflight):
            self.segments[index].aborted = True
        await asyncio.sleep(0.005)
        self.set_version(version)
        self.resume()

    def _maybe_update(self) -> None:
        version = self.updates.pop(self.generated, None)
        if version is not None:
            self.pause()
            for index in list(self._inflight):
                self.segments[index].aborted = True
            asyncio.get_running_loop().call_later(0.005, self._finish_update, version)

    def _finish_update(self, version: int) -> None:
        self.set_version(version)
        self.resume()

    async def _serve(self, input_ids: list[int], gconfig: Any, version: int) -> Any:
        """One SGLang ``/generate`` call, parsed into ``HttpGenerationResult``."""
        segment = Segment(list(input_ids), {"max_new_tokens": gconfig.max_new_tokens,
                                            "temperature": 0.0 if gconfig.greedy else gconfig.temperature,
                                            "top_p": gconfig.top_p, "top_k": gconfig.top_k,
                                            "stop_token_ids": list(gconfig.stop_token_ids), "stop": gconfig.stop,
                                            "seed": getattr(gconfig, "seed", None)}, version)
        self.segments.append(segment)
        index = len(self.segments) - 1
        planned = self._continuations.pop(tuple(input_ids), None)
        if planned is None:
            planned = list(self.respond(list(input_ids)))
        out: list[int] = []
        logprobs: list[float] = []
        stop_reason = "length"
        self._inflight.add(index)
        try:
            while len(out) < gconfig.max_new_tokens:
                await asyncio.sleep(0)
                if segment.aborted:
                    stop_reason = "abort"
                    break
                if len(out) >= len(planned):
                    stop_reason = "stop"
                    break
                token = planned[len(out)]
                out.append(token)
                logprobs.append(token_logprob(token, len(input_ids) + len(out) - 1, version))
                self.generated += 1
                self._maybe_update()
                if token in gconfig.stop_token_ids or (token == self.eos_token_id and not gconfig.ignore_eos):
                    stop_reason = "stop"
                    break
            else:
                stop_reason = "length"
            if stop_reason == "abort" or (stop_reason == "length" and len(out) < len(planned)):
                self._continuations[tuple(input_ids) + tuple(out)] = planned[len(out):]
        finally:
            self._inflight.discard(index)
        segment.output = list(out)
        segment.stop_reason = stop_reason
        return self.classes.HttpGenerationResult(output_tokens=out, output_logprobs=logprobs, stop_reason=stop_reason)

    async def agenerate(self, req: Any) -> Any:
        self.requests.append(req)
        self.request_copies.append(copy.deepcopy(req))
        req = req.copy()
        gconfig = req.gconfig
        if gconfig.n_samples != 1:
            raise ValueError("Inference engines do not support n_samples > 1. "
                             "Please call generate multiple times with n_samples = 1.")
        max_new_tokens = min(gconfig.max_tokens - len(req.input_ids), gconfig.max_new_tokens)
        if max_new_tokens <= 0:
            raise RuntimeError(f"max_new_tokens ({max_new_tokens}) is non-positive!")
        req.gconfig.max_new_tokens = max_new_tokens
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        stop_reason = None
        original_max = gconfig.max_new_tokens
        while stop_reason not in ("stop", "tool_calls", "length") and len(tokens) < original_max:
            while self.is_paused():
                await asyncio.sleep(self.pause_poll_s)
            request_version = self.get_version()
            result = await self._serve(req.input_ids, req.gconfig, request_version)
            stop_reason = result.stop_reason
            tokens.extend(result.output_tokens)
            logprobs.extend(result.output_logprobs)
            versions.extend([request_version] * len(result.output_tokens))
            req.input_ids += result.output_tokens
            req.gconfig.max_new_tokens -= len(result.output_tokens)
            assert req.gconfig.max_new_tokens >= 0
        if stop_reason == "abort":
            stop_reason = "length"
        return self.classes.ModelResponse(
            input_tokens=req.input_ids[: len(req.input_ids) - len(tokens)], input_images=req.image_data,
            output_tokens=tokens, output_logprobs=logprobs, output_versions=versions, stop_reason=stop_reason,
            latency=0.0, ttft=0.0, tokenizer=req.tokenizer, processor=req.processor,
        )


# -- areal/utils/data.py -----------------------------------------------------------


def concat_padded_tensors(tensor_dicts: list[dict[str, Any]], pad_value: float = 0.0) -> dict[str, Any]:
    """AReaL's join of episode dicts: same keys required; [B, L...] right-padded, 1-D concatenated."""
    import torch

    if not tensor_dicts:
        return {}
    keys = set(tensor_dicts[0])
    for d in tensor_dicts[1:]:
        if set(d) != keys:
            raise ValueError(f"different keys: {sorted(keys)} vs {sorted(d)}")
    max_len = max(d["attention_mask"].shape[1] for d in tensor_dicts)
    out = {}
    for key in tensor_dicts[0]:
        parts = []
        for d in tensor_dicts:
            t = d[key]
            if t.dim() >= 2 and t.shape[1] < max_len:
                pad = torch.full((t.shape[0], max_len - t.shape[1], *t.shape[2:]),
                                 0 if key == "attention_mask" else pad_value, dtype=t.dtype)
                t = torch.cat([t, pad], dim=1)
            parts.append(t)
        out[key] = torch.cat(parts, dim=0)
    return out
