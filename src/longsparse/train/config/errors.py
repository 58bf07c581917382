"""The error every config check raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad preset, override or resolved config (message says what and what is valid)."""
