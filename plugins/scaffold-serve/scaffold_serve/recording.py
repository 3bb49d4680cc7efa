"""``scaffold serve``'s side of a run: the components a config names, and finished sessions written as training data.

This is the one module of the plugin that assembles scaffold's run machinery (the
registry's components, the verifier pool, the trajectory maker, the output files).
A finished session is scored (the posted reward, else the task's verifier on its
answer, else left unscored: never 0), turned into training samples by the config's
trajectory maker, and appended as one line to ``<output>/sessions.jsonl``: the
session's record (calls, conversations with ids, masks, logprobs and versions) and
its samples. Sessions still open when the server stops are written too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaffold_core.config import Config
from scaffold_core.episode import EpisodeResult
from scaffold_core.output.codec import dumps_compact
from scaffold_core.output.files import make_dir, open_append, safe_child
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.verifier import Verdict

from .clients_task import NAME as CLIENTS
from .session import Session

SESSIONS_FILE = "sessions.jsonl"


@dataclass
class Components:
    engine: Any
    verifier: Any  # None: no task (an engine-only config), so no verifier: rewards come from the clients
    trajectory_maker: Any
    tool_format: Any
    model_name: str
    engine_name: str


def build(config: Config, registry: Any) -> Components:
    """The engine, verifier and trajectory maker the config names; the tool format and model name from the
    ``openai_agent`` controller section when the config has one (so one YAML both serves and runs)."""
    def make(section: str, kind: str) -> Any:
        comp = getattr(config, section)
        return registry.create(kind, comp.name, comp.options, path=section)

    agent = config.controller.options if config.controller.name.split(":")[-1] == "openai_agent" else {}
    spec = agent.get("tool_format", "hermes")
    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    fmt = registry.create("tool_format", spec.pop("name"), spec, path="controller.tool_format")
    verifier = None if config.task.name == CLIENTS else make("verifier", "verifier")
    return Components(engine=make("engine", "engine"), verifier=verifier,
                      trajectory_maker=make("trajectory", "trajectory_maker"), tool_format=fmt,
                      model_name=str(agent.get("model_name", "scaffold")), engine_name=config.engine.name)


class Recorder:
    """Scores finished sessions and appends them to ``<output>/sessions.jsonl``."""

    def __init__(self, config: Config, components: Components, output: Path):
        self.config = config
        self.components = components
        self.output = output
        self.pool = None if components.verifier is None else VerifierPool(
            components.verifier, timeout=config.verifier_timeout, workers=config.verifier_workers,
            name=config.verifier.name)
        self.private = config.output.private
        make_dir(output, private=self.private)
        self.path = safe_child(output, SESSIONS_FILE)
        self.written = 0

    async def finish(self, session: Session) -> dict[str, Any]:
        """Score, make samples, write one line; returns the session's summary with what was written."""
        verdict = await self.verdict(session)
        samples = [t.sample(session.answer or "", verdict, k, {"session": session.id}, rollout=0)
                   for k, t in enumerate(session.trajectories)]  # one session, one agent run
        episode = EpisodeResult(episode_id=session.id, index=self.written, status="ok", reference=session.reference,
                                samples=samples, metrics={"drift": float(session.drift_count)})
        training = self.components.trajectory_maker.make(episode) if samples else []
        line = {**session.to_dict(), "verdict": _verdict(verdict), "samples": [s.to_dict() for s in training]}
        self._append(dumps_compact(line) + b"\n")
        return {**session.summary(), "reward": None if math.isnan(verdict.reward) else verdict.reward,
                "samples": len(training), "written_to": str(self.path)}

    async def verdict(self, session: Session) -> Verdict:
        if session.reward is not None:
            return Verdict(session.reward, session.answer, None, "reward posted to the session")
        if session.answer is None:
            return Verdict(math.nan, None, None, "no answer and no reward were posted")
        if self.pool is None:
            return Verdict(math.nan, session.answer, None, "no reward was posted, and the config has no task whose "
                                                           "verifier could score the answer")
        return (await self.pool.verify_many([(session.answer, session.reference)]))[0]

    def _append(self, data: bytes) -> None:
        fd = open_append(self.path, private=self.private)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.written += 1

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _verdict(verdict: Verdict) -> dict[str, Any]:
    return {"reward": None if math.isnan(verdict.reward) else verdict.reward, "extracted": verdict.extracted,
            "reason": verdict.reason}
