"""One row through a scaffold controller on an engine: components from names, a row that is the prompt.

This is the small piece a trainer adapter needs from the core's runtime:
build the task, controller, verifier and trajectory maker once (controller
started once, verifier pool shared), then run one episode per row and get
its :class:`~scaffold_core.episode.EpisodeResult` with training samples.
scaffold-areal and scaffold-verl keep identical copies of this module so
that neither depends on the other.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from scaffold_core.controller import close_controller, start_controller
from scaffold_core.episode import EpisodeResult
from scaffold_core.run.runtime import Runtime
from scaffold_core.run.verifier_pool import VerifierPool
from scaffold_core.sampling import SamplingParams, derive_seed
from scaffold_core.task import Prompt, Task, episode_context
from scaffold_core.tokenizers import encode, render_chat


def to_plain(value: Any) -> Any:
    """Plain dicts, lists and scalars from config objects (OmegaConf, numpy arrays and scalars)."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, Sequence):
        return [to_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return to_plain(value.tolist())
    return value


def build_component(kind: str, spec: Any, *, path: str, registry: Any = None) -> Any:
    """A component from a registered name, ``{name: ..., options...}``, or an object used as it is."""
    if spec is None:
        return None
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = to_plain(spec)
        name = options.pop("name", None)
        if not isinstance(name, str):
            raise ValueError(f"{path} must be a registered {kind} name or {{name: ..., options...}}, got {spec!r}")
    else:
        return spec
    if registry is None:
        from scaffold_core.plugins import get_registry

        registry = get_registry()
    return registry.create(kind, name, options, path=path)


def lookup(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, where a dotted key walks nested mappings (``reward_model.ground_truth``); None if absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


class PromptTask(Task):
    """A task whose row is the prompt: chat messages under ``messages_key``, the gold answer under ``reference_key``.

    Keys may be dotted paths into nested mappings. ``chat_template_kwargs``
    go to the tokenizer's chat template (``enable_thinking``, ...). A row
    holding ``prompt_ids`` (ids a trainer already rendered) uses them as they are.
    """

    def __init__(self, messages_key: str = "messages", reference_key: str | None = "answer",
                 chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__()
        self.messages_key = messages_key
        self.reference_key = reference_key
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def load(self) -> list[dict[str, Any]]:
        return []

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = to_plain(lookup(row, self.messages_key))
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(f"row[{self.messages_key!r}] must be a non-empty list of chat messages "
                             f"({{'role': ..., 'content': ...}}); got {type(messages).__name__}. Set messages_key "
                             f"to the field holding the prompt, or name a scaffold task that builds it")
        return messages

    def reference(self, row: dict[str, Any]) -> str | None:
        if self.reference_key is None:
            return None
        value = lookup(row, self.reference_key)
        return None if value is None else str(value)

    def build_prompt(self, row: dict[str, Any], tokenizer: Any) -> Prompt:
        messages = self.messages(row)
        ids = row.get("prompt_ids")
        if ids is not None:
            ids = [int(i) for i in to_plain(ids)]
            return Prompt(text=tokenizer.decode(ids), ids=ids, messages=messages)
        if not self.chat_template_kwargs:
            text, ids = render_chat(tokenizer, messages)
        else:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 **self.chat_template_kwargs)
            ids = encode(tokenizer, text)
        return Prompt(text=text, ids=ids, messages=messages)


class EpisodeRunner:
    """Runs rows through a controller on one engine; shared by every episode of a trainer's worker.

    The controller prototype is started once (on the first episode's event
    loop) and each episode runs on its own clone; the verifier runs off the
    loop in a shared pool. Every wait is bounded (``request_timeout``,
    ``episode_timeout``, ``verifier_timeout``). :meth:`close` releases the
    controller's resources and the pool.
    """

    def __init__(self, *, engine: Any, task: Any, controller: Any, sampling: SamplingParams, verifier: Any = None,
                 trajectory_maker: Any = None, request_timeout: float = 3600.0, episode_timeout: float = 7200.0,
                 verifier_timeout: float = 30.0, verifier_workers: int = 2, retries: int = 0):
        if trajectory_maker is None:
            from scaffold_core.builtins.trajectories import SingleTurnTrajectoryMaker

            trajectory_maker = SingleTurnTrajectoryMaker()
        self.engine = engine
        self.task = task
        self.controller = controller
        self.sampling = sampling
        self.verifier = verifier
        self.trajectory_maker = trajectory_maker
        self.request_timeout = request_timeout
        self.episode_timeout = episode_timeout
        self.verifier_timeout = verifier_timeout
        self.verifier_workers = verifier_workers
        self.retries = retries
        self._runtime: Runtime | None = None
        self._pool: VerifierPool | None = None
        self._lock: asyncio.Lock | None = None
        self._started = False

    async def start(self) -> None:
        """Start the controller prototype and the verifier pool (once; later calls return at once)."""
        if self._runtime is not None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._runtime is not None:
                return
            self._started = True
            await start_controller(self.controller)
            if self.verifier is not None:
                self._pool = VerifierPool(self.verifier, timeout=self.verifier_timeout, workers=self.verifier_workers,
                                          name=type(self.verifier).__name__)
            self._runtime = Runtime(engine=self.engine, controller=self.controller, verifier=self._pool,
                                    trajectory_maker=self.trajectory_maker, request_timeout=self.request_timeout,
                                    episode_timeout=self.episode_timeout, retries=self.retries)

    async def close(self) -> None:
        """Release the verifier pool and the controller's resources (safe twice)."""
        self._runtime = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._started:
            self._started = False
            await close_controller(self.controller)

    async def run_row(self, row: dict[str, Any], *, index: int = 0, episode_id: str | None = None,
                      sampling: SamplingParams | None = None) -> EpisodeResult:
        """Run one episode on ``row`` (with ``sampling``, default the runner's); a failure comes back as a
        failed result with its component and reason."""
        await self.start()
        assert self._runtime is not None
        episode_id = episode_id or f"{row.get('id', index)}-{uuid.uuid4().hex[:12]}"
        sampling = sampling or self.sampling
        try:
            ctx = episode_context(self.task, index, row, self.engine.tokenizer, sampling)
        except Exception as exc:  # an unusable row fails its episode, never the trainer's process
            return EpisodeResult(episode_id=episode_id, index=index, status="failed", row=row,
                                 error=f"building the prompt failed: {type(exc).__name__}: {exc}",
                                 error_component="task")
        ctx.episode_id = episode_id
        ctx.seed = derive_seed(sampling.seed, episode_id)
        return await self._runtime.run_episode(ctx)
