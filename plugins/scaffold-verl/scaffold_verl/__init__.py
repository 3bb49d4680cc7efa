"""scaffold-verl: run any scaffold controller as a verl agent loop.

verl selects agent loops by name from a YAML list (``agent_loop_config_path``)::

    - name: scaffold_agent
      _target_: scaffold_verl.agent_loop.ScaffoldAgentLoop
      controller: {name: majority_vote, samples: 4}
      verifier: gsm8k

Modules:

* :mod:`scaffold_verl.agent_loop`: ``ScaffoldAgentLoop``, registered as ``scaffold_agent`` (imports verl)
* :mod:`scaffold_verl.loop`: what ``run`` does (no verl import), with the core's ``TrainingRollouts``
* :mod:`scaffold_verl.engine`: scaffold's engine contract over ``server_manager.generate``
* :mod:`scaffold_verl.output`: the ``AgentLoopOutput`` fields of a finished episode

The plugin registers no components: verl drives it, not ``scaffold run``.
verl itself is never a dependency: ``pip install "scaffold-verl[verl]"``.
"""

from __future__ import annotations

__version__ = "0.1.0"
