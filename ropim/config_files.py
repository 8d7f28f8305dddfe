"""How ``ropim`` reads YAML config files: jsonargparse's own YAML loader, with two answers it lacks.

* An empty file (or one holding only comments) is an empty config: it changes nothing.
* A key given twice in one mapping is refused, naming the file, the key and both lines (YAML keeps the last one
  silently, so a forgotten line would win or lose by its position).

``parser_mode()`` registers the loader with jsonargparse's public ``set_loader`` (when a parser is built, never at
import) and returns the mode name to give ``ArgumentParser(parser_mode=...)``. Values typed on the command line
go through jsonargparse's loader unchanged; only whole files (the loader is given their ``path``) get the checks.
"""

from __future__ import annotations

import os

from ropim.errors import ConfigError

MODE = "ropim_yaml"


def duplicate_key(stream: str) -> tuple[str, int, int] | None:
    """(dotted key, first line, second line) of the first key given twice in one mapping of ``stream``, else None."""
    import yaml

    def walk(node, prefix: str):
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        return f"{prefix}{key.value}", seen[key.value], line
                    seen[key.value] = line
                found = walk(value, f"{prefix}{getattr(key, 'value', '?')}.")
                if found:
                    return found
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                found = walk(item, f"{prefix}{i}.")
                if found:
                    return found
        return None

    try:
        return walk(yaml.compose(stream, Loader=yaml.SafeLoader), "")
    except yaml.YAMLError:
        return None  # not YAML: the loader itself says so


def load(stream: str, path: str | os.PathLike = ""):
    """jsonargparse's YAML loader; for a file (``path``) an empty one is ``{}`` and a duplicated key a ConfigError."""
    from jsonargparse import get_loader

    if path:
        twice = duplicate_key(stream)
        if twice:
            key, first, second = twice
            raise ConfigError(f"config file {os.fspath(path)}: key {key!r} is given twice (lines {first} and "
                              f"{second}); keep one")
    value = get_loader("yaml")(stream)
    return {} if path and value is None else value


def parser_mode() -> str:
    """Register ``load`` with jsonargparse (idempotent) and return its mode name."""
    import yaml
    from jsonargparse import set_loader

    set_loader(MODE, load, exceptions=(yaml.YAMLError,))
    return MODE
