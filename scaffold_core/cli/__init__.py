"""The ``scaffold`` command line (``main``), and ``scaffold new-plugin``'s package generator."""

from .main import main

__all__ = ["main"]
