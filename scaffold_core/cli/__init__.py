"""The ``scaffold`` command line (``main``), and ``scaffold new-plugin``'s package generator."""

from .main import console, main

__all__ = ["console", "main"]
