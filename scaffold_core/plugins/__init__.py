"""Plugin machinery: the hookspecs, discovery and failure policy, the component registry, option validation.

``markers`` (the pluggy markers), ``hookspecs`` (every hook, documented where
defined), ``kinds`` (the table of component kinds), ``options`` (YAML options
validated against a factory's signature), ``registry`` (components by kind
and name), ``manager`` (loading built-ins and entry points, the process-wide
plugin set), ``lifecycle`` (calling the lifecycle hooks safely) and ``exports`` (a plugin root's public names,
loaded on first use).
"""

from .exports import lazy_exports
from .kinds import KINDS, SECTION_KINDS, Kind
from .manager import (
    BUILTIN,
    DEFAULT_PLUGINS,
    DISABLE_ENV,
    ENTRY_POINT_GROUP,
    EXTRA_ENV,
    PluginInfo,
    PluginSet,
    build_tool_format,
    current_path,
    current_registry,
    extra_plugin_specs,
    get_plugins,
    get_registry,
    import_spec,
    set_plugins,
)
from .markers import hookimpl, hookspec
from .options import Help, OptionInfo, option_table
from .registry import BrokenPlugin, ComponentInfo, ComponentRegistry, Registry

__all__ = [
    "BUILTIN", "DEFAULT_PLUGINS", "DISABLE_ENV", "ENTRY_POINT_GROUP", "EXTRA_ENV", "KINDS",
    "SECTION_KINDS", "BrokenPlugin", "ComponentInfo", "ComponentRegistry", "Help", "Kind", "OptionInfo", "PluginInfo",
    "PluginSet", "option_table",
    "Registry", "build_tool_format", "current_path", "current_registry", "extra_plugin_specs", "get_plugins",
    "get_registry", "hookimpl", "hookspec", "import_spec", "lazy_exports", "set_plugins",
]
