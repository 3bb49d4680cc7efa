"""Conformance base classes: subclass one in your plugin's tests to check a component against its contract.

===============================  ==========================================================
class                            checks
===============================  ==========================================================
:class:`TaskConformance`         rows load, prompts build, the gold answer passes the
                                 task's verifier, the default config resolves, one episode
                                 runs end to end
:class:`VerifierConformance`     gold passes, wrong fails, garbage and huge inputs handled
                                 in bounded time, deterministic, thread-safe
:class:`EngineConformance`       one logprob per output id, max_tokens / stop strings /
                                 stop ids honoured, valid finish reasons, concurrent and
                                 seeded requests
:class:`ControllerConformance`   clone isolation, process is a generator, episodes
                                 complete, concurrency does not change results, engine
                                 errors fail episodes; a subclass's hidden state isolated
                                 across 1,000 concurrent episodes; parallel branches see
                                 only their own row, messages and state
:class:`TrajectoryMakerConformance`  key set, equal lengths, masks, token faithfulness,
                                 JSON and tensor-dict output
:class:`ToolConformance`         valid schema and spec, bad arguments as error results,
                                 timeouts respected, no state shared between episodes
===============================  ==========================================================

Each class builds the component by its registered ``name`` from your
``plugin`` module, as ``scaffold run`` would; see each class for the knobs.
This module needs pytest; it is imported only by tests.
"""

from .controllers import ControllerConformance
from .engines import EngineConformance
from .tasks import TaskConformance
from .tools import ToolConformance
from .trajectories import TrajectoryMakerConformance
from .verifiers import VerifierConformance

__all__ = ["ControllerConformance", "EngineConformance", "TaskConformance", "ToolConformance",
           "TrajectoryMakerConformance", "VerifierConformance"]
