"""The ``reasoning_gym`` verifier: a response scored by its dataset's own ``score_answer``.

The answer is extracted as the library's evaluations extract it (``reasoning_gym.utils.extract_answer``: the
last ``<answer>...</answer>``; ``extract: none`` scores the whole response), then the dataset that generated
the entry scores it: ``dataset.score_answer(answer, entry=dataset[index])``. The reward is exactly the
library's, for every dataset, those with many right answers (countdown, sudoku, ...) included.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from scaffold_core.errors import VerifierError
from scaffold_core.verifier import Reference, Verdict, Verifier

from .datasets import dataset


class ReasoningGymVerifier(Verifier):
    """Scores with the dataset's own ``score_answer`` (see the module docstring). Options: ``extract``
    (``answer_tag``: the library's ``<answer>`` extraction, or ``none``: the whole response, stripped)."""

    executor = "thread"

    def __init__(self, extract: Literal["answer_tag", "none"] = "answer_tag"):
        if extract not in ("answer_tag", "none"):
            raise ValueError(f"extract must be answer_tag (the library's <answer> tags) or none, got {extract!r}")
        self.extract = extract

    def verify(self, response: str, reference: Reference) -> Verdict:
        if not isinstance(reference, dict) or "dataset" not in reference or "index" not in reference:
            raise VerifierError(f"the reasoning_gym verifier scores the reasoning_gym task's rows; got reference "
                                f"{str(reference)[:80]!r}: use task: {{name: reasoning_gym, dataset: ...}}")
        config: Any = reference.get("config") or {}
        size: Any = reference["size"]
        seed: Any = reference["seed"]
        index: Any = reference["index"]
        data = dataset(str(reference["dataset"]), dict(config), int(size), int(seed))
        if self.extract == "answer_tag":
            from reasoning_gym.utils import extract_answer

            answer = extract_answer(response)
        else:
            answer = response.strip()
        entry = data[int(index)]
        reward = data.score_answer(answer, entry=entry)
        if reward is None or not math.isfinite(float(reward)):
            raise VerifierError(f"reasoning-gym dataset {reference['dataset']!r}: score_answer gave {reward!r}")
        reward = float(reward)
        why = "no <answer> tag" if answer is None else f"score_answer {reward:g}"
        return Verdict(reward, answer, answer.strip() if isinstance(answer, str) else None, why)
