"""The error type for bad user input; its message names the input and the fix."""


class ConfigError(ValueError):
    """A config value, path or URI the user gave cannot work; raised before expensive work starts."""
