"""A scripted "dice" model for tests of evaluations and reports: problem i of task ``sums`` is answered right
with probability (i % 5) / 4, by each request's seed, so answers differ by seed and pass@k has something to show.
The pytest plugin offers it as the ``dice_plugins`` and ``dice_config`` fixtures."""

from __future__ import annotations

from scaffold_core import hookimpl

#: Text a model could write that must stay text in a report (it would end a script or open a tag).
HOSTILE = "</script><script>window.hacked=1</script><img src=x onerror=alert(1)>{{JS}}"


def dice_respond(prompt: str, request) -> str:
    """A scripted model: problem i is answered right with probability (i % 5) / 4, by the request's seed;
    some answers ramble past max_tokens, some carry HTML that must stay text."""
    import random
    import re

    found = re.search(r"What is (\d+) \+ (\d+)", prompt)
    a, b = (int(x) for x in found.groups()) if found else (1, 1)
    rng = random.Random(request.seed)
    skill = (a % 5) / 4
    if rng.random() < 0.1:
        return "Let me think. " * 40  # stops on length (128 tokens)
    answer = a + b if rng.random() < skill else a + b + rng.choice([-10, -1, 1, 10])
    return f"{HOSTILE} {answer}" if rng.random() < 0.2 else str(answer)


class DicePlugin:
    """Task ``sums`` (``count`` additions; the first operand sets the difficulty; the second question carries
    :data:`HOSTILE`), engine ``dice`` and a verifier ``last_number`` (exact match on the last word)."""

    @hookimpl
    def register_tasks(self, registry):
        from scaffold_testkit import ListTask

        class Sums(ListTask):
            default_config = {"verifier": {"name": "last_number"}, "sampling": {"max_tokens": 128}}

            def __init__(self, count: int = 12):
                super().__init__([{"id": f"sum-{i:02d}", "question": f"What is {10 + i} + {20 + 3 * i}?"
                                   + (f" {HOSTILE}" if i == 1 else ""), "answer": str(30 + 4 * i)}
                                  for i in range(count)])

        registry.add("sums", Sums)

    @hookimpl
    def register_engines(self, registry):
        from scaffold_testkit.engines import ScriptedEngine

        registry.add("dice", lambda: ScriptedEngine(dice_respond))

    @hookimpl
    def register_verifiers(self, registry):
        from scaffold_core.verifier import Verdict, Verifier

        class LastNumber(Verifier):
            def verify(self, response, reference):
                words = response.split()
                last = words[-1] if words and words[-1].lstrip("-").isdigit() else None
                if last is None:
                    return Verdict(0.0, None, None, "no number at the end")
                return Verdict(float(last == str(reference)), last, last, "match" if last == str(reference) else "no")

        registry.add("last_number", LastNumber)
