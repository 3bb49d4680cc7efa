"""scaffold-sglang: the ``sglang`` engine, a client of SGLang servers' native HTTP API plus a server launcher.

Registered through the ``scaffold`` entry point group. Importing this module is
cheap: aiohttp, pydantic and transformers load only when an engine starts.
"""

from scaffold_core import hookimpl

from .engine import SGLangEngine

__version__ = "0.1.0"
__all__ = ["SGLangEngine", "__version__"]


@hookimpl
def register_engines(registry):
    registry.add("sglang", SGLangEngine)
