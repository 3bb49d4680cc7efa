"""scaffold-sglang: SGLang inference engine backend (HTTP client and server launcher) for scaffold."""

__version__ = "0.1.0"
