"""The one table of component kinds: each one's name, the hook that registers it, the config section selecting it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One component kind.

    ``name`` is what ``list-plugins`` and error messages say; ``hook`` the
    ``register_*`` hookspec plugins implement; ``section`` the top-level
    config section that selects one by ``name`` (``None`` for kinds that
    other components select in their own options, such as a multi-turn
    controller's ``environment``).
    """

    name: str
    hook: str
    section: str | None


#: Every component kind, in listing order.
KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("task", "register_tasks", "task"),
    Kind("controller", "register_controllers", "controller"),
    Kind("verifier", "register_verifiers", "verifier"),
    Kind("engine", "register_engines", "engine"),
    Kind("trajectory_maker", "register_trajectory_makers", "trajectory"),
    Kind("environment", "register_environments", None),
    Kind("tool", "register_tools", None),
    Kind("tool_format", "register_tool_formats", None),
    Kind("trainer", "register_trainers", "trainer"),
)}

#: Config section -> the kind it selects, for the sections that select a component.
SECTION_KINDS: dict[str, str] = {kind.section: kind.name for kind in KINDS.values() if kind.section}
