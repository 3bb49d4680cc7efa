"""Secrets kept out of the logs a run writes: the values to hide, and a copier that writes a process's
output into its log with them replaced by ``***`` (as the console shows a launched server's command).

The secrets are the values of environment variables whose names say they hold one (``*API_KEY*``,
``*TOKEN*`` but not ``*TOKENS*`` or ``*TOKENIZER*``, ``*SECRET*``, ``*PASSWORD*``, ``*CREDENTIAL*``,
``*AUTHORIZATION*``), of the variables a config
names in an ``*api_key_env`` option, and config values under such names; values shorter than
:data:`MIN_SECRET_LENGTH` are left alone (``TOKENIZERS_PARALLELISM=false`` is no secret).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import IO, Any

SECRET_NAME = re.compile(r"api[_-]?key|token(?!iz|s\b|s_)|secret|passw(?:or)?d|credential|authorization|auth[_-]?key",
                         re.IGNORECASE)
MIN_SECRET_LENGTH = 8
MASK = b"***"
#: Longest piece of output redacted at once (a longer line is redacted piecewise).
CHUNK = 1 << 16


def _config_leaves(data: Any, key: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(data, Mapping):
        for k, v in data.items():
            yield from _config_leaves(v, str(k))
    elif isinstance(data, list):
        for v in data:
            yield from _config_leaves(v, key)
    else:
        yield key, data


def secret_values(environ: Mapping[str, str] | None = None, config: Any = None) -> list[str]:
    """The secret strings to hide, longest first."""
    env = os.environ if environ is None else environ
    found = {value for name, value in env.items() if SECRET_NAME.search(name)}
    for key, value in _config_leaves(config or {}):
        if not isinstance(value, str):
            continue
        if key.endswith("_env"):
            if SECRET_NAME.search(key) and value in env:
                found.add(env[value])
        elif SECRET_NAME.search(key):
            found.add(value)
    return sorted((v for v in found if len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)


class Redactor:
    """Replaces every secret in a piece of output with ``***``."""

    def __init__(self, secrets: Iterable[str]):
        encoded = [s.encode("utf-8") for s in secrets if s]
        self.pattern = re.compile(b"|".join(re.escape(s) for s in sorted(encoded, key=len, reverse=True))) \
            if encoded else None

    def redact(self, data: bytes) -> bytes:
        return data if self.pattern is None else self.pattern.sub(MASK, data)


def copy_redacted(source: IO[bytes], fd: int, redactor: Redactor) -> None:
    """Copy ``source`` (a pipe) line by line into the open file ``fd``, redacted, until EOF; closes both."""
    try:
        for line in iter(lambda: source.readline(CHUNK), b""):
            os.write(fd, redactor.redact(line))
    except (OSError, ValueError):  # the log's disk is full, or the pipe was closed under us
        pass
    finally:
        for close in (source.close, lambda: os.close(fd)):
            try:
                close()
            except OSError:
                pass
