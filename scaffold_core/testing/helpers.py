"""Registries, tasks and runners for tests."""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from ..episode import EpisodeContext, EpisodeResult
from ..plugins import PluginSet
from ..runtime import Runtime
from ..sampling import SamplingParams, derive_seed
from ..task import Task
from ..verifier import VerifierPool


def plugin_set(*plugins: Any, entry_points: bool = False, **named: Any) -> PluginSet:
    """A fresh PluginSet with the built-ins, ``plugins`` (auto-named) and ``named`` plugins registered."""
    extra = {f"test-plugin-{i}": p for i, p in enumerate(plugins)}
    extra.update(named)
    return PluginSet().load(entry_points=entry_points, extra=extra)


class ListTask(Task):
    """A task over in-memory rows with ``question`` and ``answer`` fields."""

    def __init__(self, rows: list[dict[str, Any]] | None = None, system: str | None = None):
        super().__init__()
        self.rows = list(rows or [])
        self.system = system

    def load(self) -> Iterable[dict[str, Any]]:
        return list(self.rows)

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": str(row["question"])}]

    def reference(self, row: dict[str, Any]) -> str | None:
        answer = row.get("answer")
        return None if answer is None else str(answer)


def make_contexts(task: Task, tokenizer: Any, sampling: SamplingParams | None = None) -> list[EpisodeContext]:
    sampling = sampling or SamplingParams(max_tokens=64)
    out = []
    for i, row in enumerate(task.load()):
        prompt = task.build_prompt(row, tokenizer)
        eid = str(row.get("id", i))
        out.append(EpisodeContext(
            episode_id=eid, index=i, row=row, prompt_ids=prompt.ids, sampling=sampling,
            seed=derive_seed(sampling.seed, eid), reference=task.reference(row), prompt_text=prompt.text,
            messages=prompt.messages, tokenizer=tokenizer,
        ))
    return out


def run_episodes(contexts: list[EpisodeContext], *, engine: Any, controller: Any, verifier: Any = None,
                 trajectory_maker: Any = None, timeout: float = 120.0, verifier_timeout: float = 10.0,
                 **runtime_options: Any) -> list[EpisodeResult]:
    """Run ``contexts`` and return results in context order (the whole call is bounded by ``timeout``)."""

    async def main() -> list[EpisodeResult]:
        pool = VerifierPool(verifier, timeout=verifier_timeout) if verifier is not None else None
        results: list[EpisodeResult] = []
        await engine.start()
        try:
            runtime = Runtime(engine=engine, controller=controller, verifier=pool,
                              trajectory_maker=trajectory_maker, **runtime_options)
            await asyncio.wait_for(runtime.run(contexts, results.append), timeout)
        finally:
            if pool is not None:
                pool.close()
            await engine.close()
        order = {c.episode_id: i for i, c in enumerate(contexts)}
        return sorted(results, key=lambda r: order.get(r.episode_id, 0))

    return asyncio.run(main())
