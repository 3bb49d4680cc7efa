"""``scaffold eval``: answers per problem from any controller, and what k of them achieve.

``estimators`` (pass@k, pass^k, majority@k, best-of-N@k for one problem),
``answers`` (each problem's answers, read from a run's episode records),
``figures`` (per k, means over problems with bootstrap intervals) and
``command`` (the run, ``eval.json``). Nothing here imports a heavy library at
import time.
"""
