"""Fixtures of scaffold-report's tests (the dice model's ``dice_plugins`` and ``dice_config`` come from the test
kit's pytest plugin)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def eval_dir(tmp_path_factory, dice_plugins, dice_config) -> Path:
    """A finished `scaffold eval` of 12 problems, 4 answers each (k = 1, 2, 4), its report not yet written."""
    from scaffold_report.eval.command import run_eval

    out = tmp_path_factory.mktemp("eval") / "run"
    run_eval(dice_config(), [1, 2, 4], output_dir=out, plugins=dice_plugins, progress=False)
    return out
