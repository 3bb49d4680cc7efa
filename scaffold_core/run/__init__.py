"""Running episodes: the runtime, a whole ``scaffold run``, its metrics, verifier pools and summary.

``runtime`` (episodes on one event loop, bounded concurrency and waits),
``rollout`` (one process's share of a run: components, rows, output),
``metrics`` (run metrics), ``verifier_pool`` / ``verifier_processes``
(verifiers off the event loop, bounded), ``finalize`` (derived files and
metrics from the store), ``summary`` (what the user is told, exit codes)
and ``score`` (``scaffold score``). Import from the submodules.
"""
