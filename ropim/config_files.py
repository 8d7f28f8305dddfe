"""How ``ropim`` reads YAML config files: jsonargparse's own YAML loader, with two answers it lacks.

* An empty file (or one holding only comments) is an empty config: it changes nothing.
* A key given twice in one mapping is refused, naming the file, the key and both lines (YAML keeps the last one
  silently, so a forgotten line would win or lose by its position).
* A file that is not UTF-8 text, not valid YAML, or YAML that is not a mapping (a list, a bare value) is refused in
  one line that names the file (jsonargparse would print a traceback, or the content without the file).

``parser_mode()`` registers the loader with jsonargparse's public ``set_loader`` (when a parser is built, never at
import) and returns the mode name to give ``ArgumentParser(parser_mode=...)``. Files given to a nested config's
flag (``--model FILE``, ``ropim transfer --finetune FILE``) reach the loader without their path: an empty one is
``{}`` and a key twice is refused there too, without the file's name."""

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


def check_text(path: str | os.PathLike) -> None:
    """Raise ConfigError naming ``path`` if the file is not UTF-8 text (a binary file given as a config)."""
    try:
        with open(path, "rb") as f:
            f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {os.fspath(path)}: not a text file (byte {e.start} is not UTF-8); give a YAML "
                          "file of 'key: value' lines") from None
    except OSError:
        return  # missing or unreadable: jsonargparse names the path itself


def load(stream: str, path: str | os.PathLike = ""):
    """jsonargparse's YAML loader; for a file (``path``) an empty one is ``{}``, and a duplicated key, invalid YAML or
    YAML that is not a mapping a ConfigError naming the file."""
    import yaml
    from jsonargparse import get_loader

    if not path:  # a value typed, or a file given to a flag of a nested config (jsonargparse passes no path)
        twice = duplicate_key(stream)
        if twice:
            key, first, second = twice
            raise ConfigError(f"a config file given to a flag: key {key!r} is given twice (lines {first} and "
                              f"{second}); keep one")
        return {} if not stream.strip() else get_loader("yaml")(stream)  # only a file's content can be blank
    where = f"config file {os.fspath(path)}"
    twice = duplicate_key(stream)
    if twice:
        key, first, second = twice
        raise ConfigError(f"{where}: key {key!r} is given twice (lines {first} and {second}); keep one")
    try:
        value = get_loader("yaml")(stream)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML{at} ({getattr(e, 'problem', None) or e}); fix the file") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: holds a {type(value).__name__}, not a mapping of settings; write one 'key: value' "
                          "per line (e.g. 'epochs: 10')")
    return value


def parser_mode() -> str:
    """Register ``load`` with jsonargparse (idempotent) and return its mode name."""
    import yaml
    from jsonargparse import set_loader

    set_loader(MODE, load, exceptions=(yaml.YAMLError,))
    return MODE
