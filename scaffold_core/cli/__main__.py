"""``python -m scaffold_core.cli``: the same as the ``scaffold`` command."""

import sys

from .main import main

sys.exit(main())
