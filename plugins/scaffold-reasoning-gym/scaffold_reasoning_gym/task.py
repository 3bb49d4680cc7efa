"""The ``reasoning_gym`` task: one of reasoning-gym's procedural datasets, by name.

``task: {name: reasoning_gym, dataset: leg_counting, size: 100, seed: 42, config: {...}}`` generates the
dataset with the library's ``create_dataset`` (``config``: the fields of the dataset's config class, such as
``min_animals``). Each entry is a row: its question is the user message, after the library's system prompt
(``system_prompt: default``, the one its evaluations use, asking for the answer in ``<answer>`` tags; any
other key of its ``SYSTEM_PROMPTS``, a text of your own, or null). The reference names the entry (dataset,
config, size, seed, index); the ``reasoning_gym`` verifier scores a response with that dataset's own
``score_answer`` on the very entry the library generated.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from annotated_types import Ge

from scaffold_core.plugins import Help
from scaffold_core.task import Task

from .datasets import dataset, library


class ReasoningGymTask(Task):
    """Rows of one reasoning-gym dataset (see the module docstring).

    Options: ``dataset`` (its name), ``config`` (its config fields), ``size`` (100 entries), ``seed`` (42, the
    library's default), ``system_prompt`` (``default``), ``limit`` (rows at most).
    """

    default_config: ClassVar[dict[str, Any]] = {"verifier": {"name": "reasoning_gym"},
                                                "sampling": {"max_tokens": 1024}}

    def __init__(self, dataset: Annotated[str, Help("the reasoning-gym dataset's name")],
                 config: Annotated[dict[str, Any] | None, Help("its config fields")] = None,
                 size: Annotated[int, Ge(1), Help("entries generated")] = 100, seed: int = 42,
                 system_prompt: Annotated[str | None, Help("a key of SYSTEM_PROMPTS, a text, or null")] = "default",
                 limit: Annotated[int, Ge(1), Help("rows at most (null: every entry)")] | None = None):
        super().__init__()
        self.name = dataset
        self.config = dict(config or {})
        self.size = size
        self.seed = seed
        self.limit = limit
        library()
        from reasoning_gym.utils import SYSTEM_PROMPTS as prompts
        self.system_prompt = prompts.get(system_prompt, system_prompt) if system_prompt else None
        self.data = self._dataset()

    def _dataset(self) -> Any:
        return dataset(self.name, self.config, self.size, self.seed)

    def load(self) -> list[dict[str, Any]]:
        count = min(len(self.data), self.limit or len(self.data))
        return [{"id": f"{self.name}-{i}", "index": i, "question": str(self.data[i]["question"]),
                 "answer": str(self.data[i]["answer"])} for i in range(count)]

    def messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": row["question"]}]

    def reference(self, row: dict[str, Any]) -> dict[str, Any]:
        """The entry, by name: what the verifier regenerates to score with the dataset's own ``score_answer``
        (``answer``, the library's oracle answer, is there for the record)."""
        return {"dataset": self.name, "config": self.config, "size": self.size, "seed": self.seed,
                "index": row["index"], "answer": row["answer"]}
