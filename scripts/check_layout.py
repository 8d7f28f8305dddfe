"""`make lint`'s layout check (beside ruff and import-linter): what the package layout promises.

- no private name is imported across modules: ``from x import _y``, ``import x._y`` or ``from x._y import z``,
  of our own modules or another library's;
- no module of ``ropim/`` or ``tune/`` is over 300 lines, and no function over 60 lines.

Why 300: a module holds one responsibility. A training job is a sub-package of three (``ropim/train/<job>/``:
``config.py``, ``task.py``, ``register.py``, each well under 200 lines) beside the shared pieces (the loop, the
driver, the job declaration), so a module that outgrows the cap has taken on a second responsibility. The fix is to
split it by responsibility — never into twins named by a suffix (``*_config.py``, ``*_job.py``) to get under the cap,
which is what the cap used to produce in ``ropim/train``.

Prints one line per finding and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("ropim", "tune", "jobs", "bench", "scripts", "tests")
SIZED = ("ropim", "tune")
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every import of a private name or through a private module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if any(private(p) for p in a.name.split("."))]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if any(private(p) for p in node.module.split(".")):
                found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if private(a.name)]
    return found


def long_functions(tree: ast.AST) -> list[tuple[int, str, int]]:
    """(line, name, lines) of every function longer than MAX_FUNCTION_LINES."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [(n.lineno, n.name, n.end_lineno - n.lineno + 1) for n in functions
            if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def check(root: Path = ROOT) -> list[str]:
    """Every finding under ``root`` as a ``path:line: message`` line."""
    findings = []
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            text = path.read_text()
            tree = ast.parse(text, str(rel))
            findings += [f"{rel}:{line}: imports the private name {what}" for line, what in private_imports(tree)]
            if top in SIZED:
                n_lines = len(text.splitlines())
                if n_lines > MAX_MODULE_LINES:
                    findings.append(f"{rel}:1: {n_lines} lines, over {MAX_MODULE_LINES}: it holds more than one "
                                    "responsibility; split it by responsibility")
                findings += [f"{rel}:{line}: function {name} has {n} lines, over {MAX_FUNCTION_LINES}"
                             for line, name, n in long_functions(tree)]
    return findings


if __name__ == "__main__":
    problems = check()
    print("\n".join(problems) or "layout: ok (no private imports, modules ≤ 300 lines, functions ≤ 60 lines)")
    sys.exit(1 if problems else 0)
