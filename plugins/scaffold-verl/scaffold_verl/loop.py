"""What ``ScaffoldAgentLoop.run`` does, free of any verl import (so it is testable without verl).

verl builds an agent loop per sample (``hydra.utils.instantiate`` with its
own keyword arguments plus the YAML entry's keys) and awaits
``run(sampling_params, **row)``. The scaffold machinery that should outlive
one sample (the controller, started once; the verifier pool; the engine
adapter over ``server_manager``) is built on a loop's first run and shared
by every loop of the worker with the same options and server manager.

``run``: the row's chat (``raw_prompt``) is rendered as verl renders it
(``ct_build_initial_tokens`` when the base class has it: same template
kwargs, same ``prompt_length`` cap), the episode runs the configured
controller over ``server_manager.generate`` (:mod:`scaffold_verl.engine`)
with the core's :class:`~scaffold_core.train.prompt_groups.TrainingRollouts`
(one group of one episode per call, with this call's sampling; verl owns
the servers: ``manage_engine=False``), is scored by the configured verifier
(or left to verl's reward loop), and comes back as an ``AgentLoopOutput``
(:mod:`scaffold_verl.output`). A failed episode raises with its component
and reason: verl has no way to drop one sample, and a silent zero reward is
never handed to training.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from scaffold_core.run.assembly import Components, Limits
from scaffold_core.teacher import Teacher, make_teacher, score_samples
from scaffold_core.train.adapters import PromptTask, build_component, is_object, to_plain
from scaffold_core.train.prompt_groups import TrainingRollouts

from .api import VerlAPI, rollout_lengths
from .engine import VerlEngine, sampling_from_verl
from .output import agent_loop_fields

OPTIONS = ("controller", "verifier", "task", "trajectory", "messages_key", "reference_key", "request_timeout",
           "episode_timeout", "verifier_timeout", "retries", "max_resumes", "resume_wait_s", "teacher")


class ScaffoldEpisodeError(RuntimeError):
    """A scaffold episode inside a verl agent loop failed; ``component`` says which part."""

    def __init__(self, message: str, *, component: str | None):
        super().__init__(message)
        self.component = component


class _Shared:
    """The per-worker machinery of one loop configuration: engine adapter and rollouts."""

    def __init__(self, engine: VerlEngine, rollouts: TrainingRollouts, scored: bool, teacher: Teacher | None = None):
        self.engine = engine
        self.rollouts = rollouts
        self.scored = scored
        self.teacher = teacher
        self.teacher_started = False

    async def score(self, samples: list[Any]) -> None:
        """The teacher's logprobs on ``samples`` (started on first use)."""
        if self.teacher is None:
            return
        if not self.teacher_started:
            await self.teacher.start()
            self.teacher_started = True
        await score_samples(self.teacher, samples)


_SHARED: dict[tuple[Any, ...], tuple[Any, _Shared]] = {}


async def close_shared() -> None:
    """Close every shared rollouts (controller resources, verifier pools): a worker's shutdown, or a test's end."""
    held = list(_SHARED.values())
    _SHARED.clear()
    for _, shared in held:
        await shared.rollouts.close()
        if shared.teacher is not None and shared.teacher_started:
            await shared.teacher.close()


class ScaffoldLoop:
    """The logic of :class:`scaffold_verl.agent_loop.ScaffoldAgentLoop`; mixed into verl's ``AgentLoopBase``.

    Options (keys of the agent loop's YAML entry):

    * ``controller``: a scaffold controller name or ``{name: ..., options...}`` (default ``native``).
    * ``verifier``: a scaffold verifier name or ``{name: ..., options...}``;
      ``null`` (default) leaves the reward to verl's reward loop
      (``reward_score`` None). Controllers that verify (``majority_vote``,
      ``best_of_n``, ``multiturn_chat``) need one.
    * ``task``: a scaffold task whose ``messages(row)``/``reference(row)``
      read verl's row; by default the chat is ``messages_key``
      (``raw_prompt``) and the gold answer ``reference_key``
      (``reward_model.ground_truth``).
    * ``trajectory``: a scaffold trajectory maker (``single_turn``; ``multiturn`` for multi-turn controllers).
    * ``request_timeout``, ``episode_timeout``, ``verifier_timeout``, ``retries``: bounds, as in ``scaffold run``.
    * ``max_resumes``, ``resume_wait_s``: how often and after how long an aborted generation is continued.
    * ``teacher``: on-policy distillation: a teacher (a config's ``teacher:`` options, e.g. ``{engine: vllm,
      url: ...}``, or a :class:`~scaffold_core.teacher.Teacher`) scores each episode's samples; the output then
      carries ``extra_fields["teacher_ids"]``/``["teacher_logprobs"]`` in verl's format (see
      :mod:`scaffold_verl.output`).
    """

    #: verl's classes; set by the concrete agent loop class (the real verl, or a test's fake).
    verl: ClassVar[VerlAPI]

    def __init__(self, *args: Any, controller: Any = "native", verifier: Any = None, task: Any = None,
                 trajectory: Any = "single_turn", messages_key: str = "raw_prompt",
                 reference_key: str | None = "reward_model.ground_truth", request_timeout: float = 3600.0,
                 episode_timeout: float = 7200.0, verifier_timeout: float = 30.0, retries: int = 0,
                 max_resumes: int = 16, resume_wait_s: float = 1.0, teacher: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.scaffold_options = dict(
            controller=to_plain(controller) if not is_object(controller) else controller,
            verifier=to_plain(verifier) if not is_object(verifier) else verifier,
            task=to_plain(task) if not is_object(task) else task,
            trajectory=to_plain(trajectory) if not is_object(trajectory) else trajectory,
            messages_key=messages_key, reference_key=reference_key, request_timeout=float(request_timeout),
            episode_timeout=float(episode_timeout), verifier_timeout=float(verifier_timeout), retries=int(retries),
            max_resumes=int(max_resumes), resume_wait_s=float(resume_wait_s),
            teacher=to_plain(teacher) if not is_object(teacher) else teacher)
        self.prompt_length, self.response_length = rollout_lengths(self.rollout_config)  # type: ignore[attr-defined]

    # -- shared machinery ------------------------------------------------------
    def _key(self) -> tuple[Any, ...]:
        parts = [id(self.server_manager), id(self.tokenizer), type(self), self.prompt_length,  # type: ignore[attr-defined]
                 self.response_length, tuple(sorted(self.apply_chat_template_kwargs_plain().items()))]
        for name in OPTIONS:
            value = self.scaffold_options[name]
            parts.append((name, id(value) if is_object(value) else repr(value)))
        return tuple(parts)

    def apply_chat_template_kwargs_plain(self) -> dict[str, Any]:
        return dict(to_plain(getattr(self, "apply_chat_template_kwargs", None) or {}))

    def shared(self) -> _Shared:
        """This worker's machinery for this loop's options (built on first use, then reused)."""
        key = self._key()
        held = _SHARED.get(key)
        if held is not None:
            return held[1]
        o = self.scaffold_options
        server_manager, tokenizer = self.server_manager, self.tokenizer  # type: ignore[attr-defined]
        engine = VerlEngine(server_manager, tokenizer=tokenizer, prompt_length=self.prompt_length,
                            response_length=self.response_length, max_resumes=o["max_resumes"],
                            resume_wait_s=o["resume_wait_s"])
        verifier = build_component("verifier", o["verifier"], path="verifier")
        task = build_component("task", o["task"], path="task") or PromptTask(
            o["messages_key"], o["reference_key"], self.apply_chat_template_kwargs_plain())
        components = Components(
            task=task, controller=build_component("controller", o["controller"], path="controller"), engine=engine,
            verifier=verifier, trajectory_maker=build_component("trajectory_maker", o["trajectory"], path="trajectory"))
        # Episodes in flight are verl's to bound (its batch), not scaffold's.
        limits = Limits(concurrency=None, request_timeout=o["request_timeout"], episode_timeout=o["episode_timeout"],
                        verifier_timeout=o["verifier_timeout"], retries=o["retries"])
        rollouts = TrainingRollouts(components, sampling=sampling_from_verl({}, self.response_length), limits=limits,
                                    engine_name="verl", manage_engine=False)
        teacher = o["teacher"]
        if teacher is not None and not isinstance(teacher, Teacher):
            teacher = make_teacher(teacher)
        shared = _Shared(engine, rollouts, scored=verifier is not None, teacher=teacher)
        _SHARED[key] = (server_manager, shared)  # holds the server manager so its id stays unique
        return shared

    # -- one sample --------------------------------------------------------------
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """One verl sample as one scaffold episode; returns verl's ``AgentLoopOutput``."""
        shared = self.shared()
        await shared.rollouts.start()
        row = to_plain(dict(kwargs))
        task = shared.rollouts.components.task
        if hasattr(self, "ct_build_initial_tokens") and isinstance(task, PromptTask):
            row["prompt_ids"] = list(await self.ct_build_initial_tokens(task.messages(row)))
        elif isinstance(task, PromptTask):
            row["prompt_ids"] = self._rendered(task, row)
        params = dict(to_plain(sampling_params))
        with shared.engine.episode(params) as log:
            group = await shared.rollouts.run_group(
                row, sampling=sampling_from_verl(params, self.response_length),
                group_id=f"{row.get('uid', row.get('index', 'sample'))}-{uuid.uuid4().hex[:12]}")
        (episode,) = group.episodes
        if not episode.ok:
            raise ScaffoldEpisodeError(f"scaffold episode {episode.episode_id} failed ({episode.error_component}): "
                                       f"{episode.error}", component=episode.error_component)
        await shared.score(list(episode.trajectories))
        fields = agent_loop_fields(episode, log, prompt_length=self.prompt_length,
                                   response_length=self.response_length, scored=shared.scored)
        return self.verl.AgentLoopOutput(**fields)

    def _rendered(self, task: PromptTask, row: dict[str, Any]) -> list[int]:
        """The prompt ids as verl renders them (chat template, then left-truncated to ``prompt_length``)."""
        ids = task.build_prompt(row, self.tokenizer).ids  # type: ignore[attr-defined]
        return ids[-self.prompt_length:] if len(ids) > self.prompt_length else ids
