"""scaffold-report: what people look at. ``scaffold report`` (one self-contained, offline ``report.html`` for a run,
eval or train directory; given several, ``compare.html``), ``scaffold eval`` (answers per problem from any
controller, then pass@k, pass^k, majority@k and best-of-N@k), and the report written at the end of every
``scaffold run``, ``eval`` and ``train`` (the ``run_reporter`` hook).

The report: ``build`` (read the directory, write ``report.html``), ``page`` (the sections), ``svg`` (the charts),
``episodes`` (statistics over every episode and the sample the trajectory browser carries), ``timeline`` (where
each episode's time went, ``trace.json``), ``compare`` (several runs side by side), ``tokens`` (token texts from
the run's tokenizer), ``assets/`` (the template, stylesheet and script, inlined into every page). The evaluation:
``eval/`` (estimators, answers, figures, the command). ``commands`` holds both commands' parsers. Nothing here
imports a heavy library at import time.
"""

from __future__ import annotations

from scaffold_core import hookimpl
from scaffold_core.plugins import lazy_exports

__version__ = "0.1.0"

#: The public API (loaded on first use; everything else in this package is private).
PUBLIC = {"build_report": "build", "read_report": "build", "build_comparison": "compare", "run_eval": "eval.command"}

__getattr__ = lazy_exports(__name__, PUBLIC)


@hookimpl
def register_commands(subparsers):
    from .commands import add_commands

    add_commands(subparsers)


@hookimpl
def run_reporter():
    from .commands import Reporter

    return Reporter()
