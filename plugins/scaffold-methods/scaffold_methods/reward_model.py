"""The ``reward_model`` verifier: a reward-model checkpoint run in this process with transformers, in batches.

``kind: classifier``: a sequence-classification checkpoint (an outcome
reward model). The question and response are rendered with the
tokenizer's chat template (user, then assistant; ``use_chat_template:
false`` or a tokenizer without one: ``question``, a blank line, the
response); the score is ``sigmoid(logit)`` for a one-label head, else the
softmax probability of label ``label`` (default 1).

``kind: prm``: a causal-LM process reward model (Math-Shepherd style). The
response is split into steps at ``step_delimiter``; each step is followed by
``step_tag``; at each tag the model's next-token distribution over
``good_token`` and ``bad_token`` gives the step's probability of being
right; ``aggregate`` (``min``, ``last``, ``mean``, ``prod``) makes one score.
``checkpoint`` defaults to the bundled SmolLM2 (not a trained PRM: for
trying the pipeline).

Inputs longer than ``max_length`` tokens keep their end (the answer).
Requests from concurrent episodes and verifier threads are batched: items
arriving within ``batch_wait_ms`` of each other, up to ``max_batch_size``,
share one forward pass on the model's own worker thread (``batching.py``).
Scores lie in [0, 1]. As the run's verifier it sees only the response (the
verifier contract passes no question); as a scorer (``rerank``,
``tree_search``) it sees the episode's question too. It generates no tokens.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Generator, Sequence
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt, MinLen

from scaffold_core.episode import EpisodeContext
from scaffold_core.generation import AwaitTask
from scaffold_core.plugins import Help
from scaffold_core.verifier import Reference, Verdict, Verifier

from .batching import ThreadBatcher
from .scoring import Scores

#: Reward models alive in this process, closed by the plugin's ``on_run_end`` hook.
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


class RewardModelVerifier(Verifier):
    """A reward model as a verifier and a scorer (see the module docstring)."""

    executor: ClassVar[str] = "thread"
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, checkpoint: str | None = None, kind: Literal["classifier", "prm"] = "classifier",
                 device: str = "cpu", dtype: str = "float32", max_batch_size: Annotated[int, Ge(1)] = 16,
                 batch_wait_ms: Annotated[float, Ge(0)] = 5.0,
                 max_length: Annotated[int, Ge(8), Help("tokens of a scored text")] = 2048, label: int | None = None,
                 use_chat_template: bool = True,
                 step_delimiter: Annotated[str, MinLen(1)] = "\n",
                 step_tag: Annotated[str, MinLen(1)] = " \u043a\u0438", good_token: str = "+",
                 bad_token: str = "-", aggregate: Literal["min", "last", "mean", "prod"] = "min",
                 timeout: Annotated[float, Gt(0), Help("seconds one scoring may take")] = 300.0,
                 trust_remote_code: bool = False):
        if kind == "classifier" and not checkpoint:
            raise ValueError("a classifier reward model needs checkpoint: a local directory or hub id of a "
                             "sequence-classification model")
        self.checkpoint, self.kind, self.device, self.dtype = checkpoint, kind, device, dtype
        self.max_length, self.label, self.use_chat_template = max_length, label, use_chat_template
        self.step_delimiter, self.step_tag = step_delimiter, step_tag
        self.good_token, self.bad_token, self.aggregate = good_token, bad_token, aggregate
        self.timeout, self.trust_remote_code = timeout, trust_remote_code
        self.batcher = ThreadBatcher(self._score_batch, max_batch=max_batch_size, wait_s=batch_wait_ms / 1000.0,
                                     name="scaffold-reward-model")
        self._model: Any = None
        LIVE.add(self)

    # -- the contract --------------------------------------------------------------------------------
    def verify(self, response: str, reference: Reference) -> Verdict:
        [future] = self.batcher.submit([("", response)])
        score = future.result(self.timeout)
        return Verdict(score, None, None, f"reward model {score:.4f}")

    def episode_scores(self, ctx: EpisodeContext, question: str, responses: Sequence[str],
                       partial: bool = False) -> Generator[Any, Any, Scores]:
        if not responses:
            return Scores([], 0, [])
        batcher, items = self.batcher, [(question, r) for r in responses]

        async def scores() -> list[float]:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in batcher.submit(items))))

        wait = AwaitTask(scores, timeout=self.timeout, component="verifier", what="the reward model")
        yield [wait]
        values: list[float | None] = list(wait.result)
        return Scores(values, 0, [f"reward model {v:.4f}" for v in wait.result])

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        self.batcher.close()

    # -- the model (worker thread only) ----------------------------------------------------------
    def _load(self) -> Any:
        from scaffold_core.engines.model_loading import load_model_and_tokenizer, require_torch, resolve_model

        torch, transformers = require_torch()
        if self.kind == "prm":
            model, tokenizer, _ = load_model_and_tokenizer(resolve_model(self.checkpoint), dtype=self.dtype,
                                                           device=self.device,
                                                           trust_remote_code=self.trust_remote_code)
        else:
            tokenizer = transformers.AutoTokenizer.from_pretrained(self.checkpoint,
                                                                   trust_remote_code=self.trust_remote_code)
            model = transformers.AutoModelForSequenceClassification.from_pretrained(
                self.checkpoint, dtype=getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
                                               .get(self.dtype, self.dtype)),
                trust_remote_code=self.trust_remote_code)
            model.to(self.device)
            model.eval()
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self._model = (torch, model, tokenizer)
        return self._model

    def _score_batch(self, items: list[tuple[str, str]]) -> list[float]:
        torch, model, tokenizer = self._model or self._load()
        with torch.inference_mode():
            if self.kind == "classifier":
                return self._classify(torch, model, tokenizer, items)
            return self._process_rewards(torch, model, tokenizer, items)

    def _render(self, tokenizer: Any, question: str, response: str) -> str:
        if self.use_chat_template and getattr(tokenizer, "chat_template", None):
            chat = ([{"role": "user", "content": question}] if question else []) + \
                [{"role": "assistant", "content": response}]
            return str(tokenizer.apply_chat_template(chat, tokenize=False))
        return f"{question}\n\n{response}" if question else response

    def _classify(self, torch: Any, model: Any, tokenizer: Any, items: list[tuple[str, str]]) -> list[float]:
        rows = [tokenizer.encode(self._render(tokenizer, q, r), add_special_tokens=False)[-self.max_length:] or
                [tokenizer.pad_token_id] for q, r in items]
        ids, attention = _right_padded(torch, rows, tokenizer.pad_token_id, model.device)
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        labels = logits.shape[-1]
        if self.label is not None and not 0 <= self.label < labels:
            raise ValueError(f"label {self.label} is not one of the model's {labels} labels (0 to {labels - 1})")
        if labels == 1:
            scores = torch.sigmoid(logits[:, 0])
        else:
            scores = torch.softmax(logits, dim=-1)[:, 1 if self.label is None else self.label]
        return [float(s) for s in scores.tolist()]

    def _process_rewards(self, torch: Any, model: Any, tokenizer: Any, items: list[tuple[str, str]]) -> list[float]:
        good, bad = (_single_token(tokenizer, t) for t in (self.good_token, self.bad_token))
        tag = tokenizer.encode(self.step_tag, add_special_tokens=False)
        rows, positions = [], []
        for question, response in items:
            ids = tokenizer.encode(f"{question}\n" if question else "", add_special_tokens=False)
            marks = []
            steps = [s for s in response.split(self.step_delimiter) if s.strip()] or [response]
            for step in steps:
                ids += tokenizer.encode(step, add_special_tokens=False) + tag
                marks.append(len(ids) - 1)
            cut = max(0, len(ids) - self.max_length)
            rows.append(ids[cut:])
            positions.append([m - cut for m in marks if m >= cut])
        ids, attention = _right_padded(torch, rows, tokenizer.pad_token_id, model.device)
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        out = []
        for row, marks in enumerate(positions):
            pair = logits[row, marks][:, [good, bad]] if marks else logits[row, -1:][:, [good, bad]]
            steps = torch.softmax(pair, dim=-1)[:, 0].tolist()
            out.append(_aggregate(steps, self.aggregate))
        return out

    def __repr__(self) -> str:
        return f"RewardModelVerifier(kind={self.kind!r}, checkpoint={self.checkpoint!r})"


def _right_padded(torch: Any, rows: list[list[int]], pad: int, device: Any) -> tuple[Any, Any]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[i, : len(row)] = 1
    return ids.to(device), attention.to(device)


def _single_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"a PRM's good/bad token must be one token; {text!r} is {len(ids)} tokens for this "
                         "tokenizer (set good_token/bad_token to the checkpoint's labels)")
    return int(ids[0])


def _aggregate(steps: list[float], how: str) -> float:
    if how == "min":
        return min(steps)
    if how == "last":
        return steps[-1]
    if how == "mean":
        return sum(steps) / len(steps)
    return math.prod(steps)
