"""scaffold-llamacpp: the ``llamacpp`` engine, llama.cpp (through llama-cpp-python) in this process.

Registered through the ``scaffold`` entry point group. Importing this module is
cheap: llama_cpp, torch and transformers load only when an engine starts.
"""

from scaffold_core import hookimpl

from .engine import LlamaCppEngine

__version__ = "0.1.0"
__all__ = ["LlamaCppEngine", "__version__"]


@hookimpl
def register_engines(registry):
    registry.add("llamacpp", LlamaCppEngine)
