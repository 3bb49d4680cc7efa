"""The teacher contract of on-policy distillation: a model that scores the student's own tokens.

The student samples; a teacher is asked, for each sample, the logprob of every completion token
under the sample's exact prompt (teacher forcing: prompt ids + completion ids in, one logprob per
completion token out, and the top-k alternatives where the engine gives them). The per-token
reverse-KL advantage is ``teacher_logprob - student_logprob`` (:func:`reverse_kl_advantages`).

Teacher and student must share a tokenizer: the teacher scores the student's token ids as they
are. :func:`check_same_tokenizer` refuses two tokenizers that would split text differently
(no cross-tokenizer alignment is attempted).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: Texts whose ids two tokenizers must agree on to count as the same tokenizer.
PROBES = ("Hello, world! 12 + 30 = 42.", " The quick brown fox\njumps over the lazy dog.",
          "Ünïcödé — 日本語 ✓", "def f(x):\n    return x ** 2")


@dataclass
class TeacherScores:
    """The teacher's view of one sample's completion: one logprob per completion token, and per token
    the top-k ``{token_id: logprob}`` where the teacher gives them (else None)."""

    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None = None


@dataclass
class TeacherStats:
    """What teacher calls cost, counted apart from the student's generation."""

    calls: int = 0
    samples: int = 0
    tokens: int = 0  # prompt + completion tokens sent
    scored_tokens: int = 0  # completion tokens scored
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"teacher_calls": self.calls, "teacher_samples": self.samples, "teacher_tokens": self.tokens,
                "teacher_scored_tokens": self.scored_tokens, "teacher_s": round(self.seconds, 3)}


class Teacher:
    """Base class of teachers. Lifecycle like an engine: construct (cheap), ``await start()``, any number
    of ``await score_batch(...)``, ``await close()``. ``tokenizer`` is set after ``start()``.

    Subclasses implement :meth:`_score` (one batch); :meth:`score_batch` counts the call.
    """

    tokenizer: Any = None
    top_k: int = 0

    def __init__(self) -> None:
        self.stats = TeacherStats()

    async def start(self) -> None:
        """Load or connect. Called once before the first call."""

    async def close(self) -> None:
        """Release what ``start()`` acquired. Safe to call twice."""

    async def _score(self, batch: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TeacherScores]:
        raise NotImplementedError  # pragma: no cover

    async def score_batch(self, batch: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TeacherScores]:
        """The teacher's scores of each ``(prompt_ids, completion_ids)`` pair, in order."""
        started = time.perf_counter()
        scores = await self._score(batch)
        for (prompt, completion), s in zip(batch, scores):
            if len(s.logprobs) != len(completion):
                raise RuntimeError(f"{type(self).__name__}: {len(s.logprobs)} logprobs for {len(completion)} "
                                   "completion tokens")
            self.stats.tokens += len(prompt) + len(completion)
            self.stats.scored_tokens += len(completion)
        self.stats.calls += 1
        self.stats.samples += len(batch)
        self.stats.seconds += time.perf_counter() - started
        return scores


def tokenizer_fingerprint(tokenizer: Any) -> tuple[int | None, list[list[int]]]:
    """(vocabulary size, ids of :data:`PROBES`): what two tokenizers must share to score each other's ids."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
    return size, [list(tokenizer.encode(p, add_special_tokens=False)) for p in PROBES]


def check_same_tokenizer(student: Any, teacher: Any, teacher_name: str = "teacher") -> None:
    """Raise :class:`ConfigError` unless ``student`` and ``teacher`` tokenize alike (same vocabulary size,
    same ids for probe texts): the teacher scores the student's token ids as they are."""
    s_size, s_ids = tokenizer_fingerprint(student)
    t_size, t_ids = tokenizer_fingerprint(teacher)
    problem = None
    if s_size is not None and t_size is not None and s_size != t_size:
        problem = f"vocabularies of {s_size} (student) and {t_size} ({teacher_name}) tokens"
    else:
        for text, a, b in zip(PROBES, s_ids, t_ids):
            if a != b:
                problem = f"{text!r} is {a[:8]}... for the student but {b[:8]}... for the {teacher_name}"
                break
    if problem:
        raise ConfigError(f"{teacher_name}: its tokenizer differs from the student's ({problem}). On-policy "
                          "distillation scores the student's token ids with the teacher as they are, so both "
                          "must share one tokenizer (e.g. a larger model of the same family); cross-tokenizer "
                          "distillation is not supported")


@dataclass
class DistillMix:
    """How the per-token advantage is made: ``kl_weight * (teacher - student) + reward_weight * A``, where
    ``A`` is the sample's group advantage from the verifier's reward (the same for every token)."""

    kl_weight: float = 1.0
    reward_weight: float = 0.0
    clip: float | None = None  # bound on |teacher - student| per token (None: unbounded)


def reverse_kl_advantages(teacher: Sequence[float], student: Sequence[float], *,
                          reward_advantage: float = 0.0, mix: DistillMix | None = None) -> list[float]:
    """Per-token advantages of one sample: ``teacher_logprob - student_logprob`` (the negative of the
    per-token reverse KL estimate log pi_student - log pi_teacher), mixed with the reward (see
    :class:`DistillMix`)."""
    if len(teacher) != len(student):
        raise ValueError(f"{len(teacher)} teacher logprobs for {len(student)} student logprobs")
    m = mix or DistillMix()
    out = []
    for t, s in zip(teacher, student):
        d = t - s
        if m.clip is not None:
            d = max(-m.clip, min(m.clip, d))
        out.append(m.kl_weight * d + m.reward_weight * reward_advantage)
    return out


#: ``teacher.engine`` -> the class that serves it (``module:Class``). Plugins add theirs as entry points of the
#: group :data:`TEACHER_GROUP` (the embedded engine's plugin adds ``transformers``; the vLLM and SGLang plugins add
#: ``vllm`` and ``sglang``).
TEACHER_ENGINES = {
    "openai": "scaffold_remote.teacher:OpenAICompletionsTeacher",
}
TEACHER_GROUP = "scaffold.teachers"


def teacher_engines() -> dict[str, str]:
    """Every ``teacher.engine`` name this installation knows -> its ``module:Class``."""
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=TEACHER_GROUP)}
    return {**found, **TEACHER_ENGINES}


def make_teacher(options: dict[str, Any], **defaults: Any) -> Teacher:
    """The teacher ``options`` (a config's ``teacher:`` mapping) describe: ``engine`` (``transformers``, the
    default: another checkpoint in process; ``vllm``, ``sglang`` (from their plugins): a server's prompt
    logprobs; ``openai``: an
    OpenAI-compatible ``/v1/completions`` that echoes prompt logprobs; or ``module:Class`` of a
    :class:`Teacher` of your own), the other keys its options. ``defaults`` fill options the config leaves
    out (e.g. the trainer's device); those the class does not take are dropped."""
    import importlib
    import inspect

    opts = dict(options)
    engine = str(opts.pop("engine", "transformers"))
    known = teacher_engines()
    target = known.get(engine, engine)
    if ":" not in target:
        raise ConfigError(f"teacher.engine: {engine!r} is not one of {', '.join(sorted(known))} (plugins add "
                          "theirs: install the vLLM or SGLang plugin for vllm or sglang) nor a 'module:Class' "
                          "naming a Teacher")
    module_name, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except ImportError as exc:
        raise ConfigError(f"teacher.engine: {engine} needs {module_name} ({exc}); install it") from None
    except AttributeError:
        raise ConfigError(f"teacher.engine: {module_name} has no {name}") from None
    if not (isinstance(cls, type) and issubclass(cls, Teacher)):
        raise ConfigError(f"teacher.engine: {target} is not a Teacher")
    accepted = inspect.signature(cls).parameters
    for key, value in defaults.items():
        if key in accepted and key not in opts:
            opts[key] = value
    try:
        return cls(**opts)
    except TypeError as exc:
        raise ConfigError(f"teacher: {exc} (the options of teacher.engine {engine}: "
                          f"{', '.join(p for p in accepted if p != 'self')})") from None


def teacher_column(input_ids: Sequence[int], loss_mask: Sequence[int], prompt_len: int,
                   completion: Sequence[float]) -> list[float]:
    """A teacher's logprobs of a sequence's completion (the tokens after ``prompt_len``) as a column beside
    its behaviour ``logprobs``: one per token, 0.0 on the prompt and where the loss mask is 0."""
    n, total = prompt_len, len(input_ids)
    if len(completion) != total - n:
        raise ValueError(f"{len(completion)} teacher logprobs for {total - n} completion tokens")
    return [0.0] * n + [float(t) if m else 0.0 for t, m in zip(completion, loss_mask[n:])]


async def score_samples(teacher: Teacher, samples: Sequence[Any]) -> None:
    """Score training samples (:class:`~scaffold_core.trajectory.TrainingSample`) with ``teacher`` in one batch
    and set each one's ``teacher_logprobs`` (see :func:`teacher_column`)."""
    batch = [(list(s.input_ids[:s.prompt_len]), list(s.input_ids[s.prompt_len:])) for s in samples]
    if not batch:
        return
    scores = await teacher.score_batch(batch)
    for s, score in zip(samples, scores):
        s.teacher_logprobs = teacher_column(s.input_ids, s.loss_mask, s.prompt_len, score.logprobs)


def shifted(column: Sequence[float]) -> list[float]:
    """``column`` one position earlier (entry ``i`` describes token ``i + 1``; the last is 0.0): the alignment
    of trainers whose logprob tensors are computed from the logits at each position (AReaL's ``teacher_logp``,
    verl's ``teacher_logprobs``)."""
    return [float(v) for v in column[1:]] + [0.0] if len(column) else []
