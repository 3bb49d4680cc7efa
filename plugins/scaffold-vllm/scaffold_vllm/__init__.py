"""scaffold-vllm: the ``vllm`` engine, a client of vLLM servers' token-in/token-out API plus a server launcher.

Registered through the ``scaffold`` entry point group. Importing this module is
cheap: the protocol, the shared remote-engine layer and transformers load only
when an engine is built or starts.
"""

from scaffold_core import hookimpl

from .engine import VLLMEngine

__version__ = "0.1.0"
__all__ = ["VLLMEngine", "__version__"]


@hookimpl
def register_engines(registry):
    registry.add("vllm", VLLMEngine)
