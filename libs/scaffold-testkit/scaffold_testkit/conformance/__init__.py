"""Conformance base classes: subclass one in your plugin's tests to check a component against its contract.

===================================  ======================================================
class                                checks
===================================  ======================================================
:class:`TaskConformance`             rows load, prompts build, references are JSON, the
                                     gold answer passes the task's verifier and wrong,
                                     empty and off-by-one answers do not, an all-wrong
                                     episode completes with reward 0, the default config
                                     resolves, one episode runs end to end
:class:`VerifierConformance`         gold passes, wrong, empty and mismatched answers fail,
                                     rewards finite and within ``reward_range``, structured
                                     references, garbage and huge inputs in bounded time,
                                     deterministic, thread-safe, inline ones quick
:class:`EngineConformance`           one logprob per output id, max_tokens / stop strings /
                                     stop ids honoured, valid finish reasons, concurrent and
                                     seeded requests, the event loop never blocked,
                                     cancelled requests let go
:class:`RemoteEngineConformance`     for engines on inference servers (SGLang, vLLM), beyond
                                     EngineConformance: max_tokens above a server's default,
                                     top logprobs, a keep pause holds and keeps requests, a
                                     weight update mid-generation versions each token,
                                     context overflow is a clear error not retried
:class:`ControllerConformance`       clone isolation, process is a generator, episodes
                                     complete, concurrency does not change results, engine
                                     errors and hangs fail episodes within the timeouts, the
                                     event loop never blocked; a subclass's hidden state
                                     isolated across 1,000 concurrent episodes; parallel
                                     branches see only their own row, messages and state
:class:`TrajectoryMakerConformance`  key set, equal lengths, masks, token faithfulness,
                                     finite advantages for equal rewards, JSON and
                                     tensor-dict output
:class:`ToolConformance`             a valid definition and spec, example calls succeed, bad
                                     and schema-breaking arguments give error results,
                                     timeouts respected, concurrent calls and copies agree,
                                     the event loop never blocked
===================================  ======================================================

Every class also checks that the component is registered under ``name``, that the name
clashes with no built-in or installed plugin, and that its classes keep no mutable state at
class level (shared by every instance and clone) and the component's work changes none.

Each class builds the component by its registered ``name`` from your
``plugin`` module, as ``scaffold run`` would; see each class for the knobs.
This module needs pytest; it is imported only by tests.
"""

from .controllers import ControllerConformance
from .engines import EngineConformance
from .remote import RemoteEngineConformance
from .tasks import TaskConformance
from .tools import ToolConformance
from .trajectories import TrajectoryMakerConformance
from .verifiers import VerifierConformance

__all__ = ["ControllerConformance", "EngineConformance", "RemoteEngineConformance", "TaskConformance",
           "ToolConformance", "TrajectoryMakerConformance", "VerifierConformance"]
