"""The test kit's shared model engine (``smollm2_engine``) runs whole episodes.

Kept apart from test_testing_kit.py: the files that use the shared model run on one pytest-xdist worker
(conftest.py), and the kit's other tests need no model.
"""

from __future__ import annotations

from scaffold_testkit import ListTask, run_one_episode

from scaffold_core.builtins.verifiers import ExactMatchVerifier

ROWS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 + 3?", "answer": "6"}]


def test_one_episode_on_the_shared_model(smollm2_engine):
    """The session's model engine runs a whole episode (prompt rendered by its chat template)."""
    from scaffold_core import SamplingParams

    result = run_one_episode(ListTask(ROWS), 0, engine=smollm2_engine, verifier=ExactMatchVerifier(),
                             sampling=SamplingParams(max_tokens=8, temperature=0.0), timeout=300)
    assert result.ok, result.error
    sample = result.samples[0]
    assert 1 <= len(sample.output_ids) <= 8 and len(sample.output_logprobs) == len(sample.output_ids)
    assert sample.verdict is not None and result.trajectories[0].prompt_len == len(sample.prompt_ids)
    assert "<|im_start|>user" in result.prompt_text  # SmolLM2's own chat template
