"""``scaffold report``: one self-contained, offline HTML page for a run, eval or train directory.

``build`` (read the directory, write ``report.html``), ``page`` (the
sections), ``svg`` (the charts), ``episodes`` (statistics over every episode
and the sample the trajectory browser carries), ``tokens`` (token texts from
the run's tokenizer), ``assets/`` (the template, stylesheet and script,
inlined into every page). Nothing here imports a heavy library at import time.
"""
