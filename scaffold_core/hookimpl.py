"""The marker plugins decorate their hook implementations with: ``from scaffold_core import hookimpl``."""

import pluggy

hookimpl = pluggy.HookimplMarker("scaffold")
