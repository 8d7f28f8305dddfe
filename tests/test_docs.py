"""The documentation: the README stays a front page (≤ 250 lines), names no path of one machine, and every `ropim`
command in a fenced bash block of the README or docs/ parses with the CLI (``--print_config`` for a job, ``--help``
for the rest), so the docs and the CLI cannot drift apart."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support import run_cli_forked

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
JOBS = {"pretrain", "finetune", "graft", "segment", "demo", "probe", "transfer", "viz", "sweep"}


def commands(page: Path) -> list[list[str]]:
    """The argv of every `ropim …` line in the page's ```bash blocks (continuations joined, comments dropped)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip()
            if line.startswith("ropim "):
                found.append(shlex.split(line, comments=True)[1:])
    return found


def check_argv(argv: list[str]) -> list[str]:
    """The argv that only parses: ``--print_config`` for a job (``--resume`` left out: it reads a stored run),
    ``--help`` for the other commands."""
    if argv[0] in JOBS:
        if "--resume" in argv:
            i = argv.index("--resume")
            argv = argv[:i] + argv[i + 2:]
        return [*argv, "--print_config"]
    words = [a for a in argv if not a.startswith("-")][:2]
    return [*words[: 2 if words[:1] in (["models"], ["data"]) else 1], "--help"]


def test_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_no_page_names_a_path_of_this_machine():
    for page in PAGES:
        text = page.read_text()
        assert not re.findall(r"(?<![\w.])/(?:work|root|home|tmp)/\S+", text), page.name
        assert "../shared" not in text and str(ROOT) not in text, page.name


def test_every_documented_ropim_command_parses(tmp_path):
    cases = {" ".join(argv): check_argv(argv) for page in PAGES for argv in commands(page)}
    assert len(cases) >= 30  # the docs show the CLI: a regex that stopped matching would pass with none
    (tmp_path / "ropim").symlink_to(ROOT / "ropim")  # the docs' commands run from the repository root
    (tmp_path / "my_run.yaml").write_text("epochs: 2\n")  # the config file a user writes
    results = run_cli_forked([(argv, {}) for argv in cases.values()], cwd=tmp_path)
    failed = {shown: r.stderr.strip().splitlines()[-1:]
              for shown, r in zip(cases, results, strict=True) if r.returncode}
    assert not failed, failed


@pytest.mark.parametrize("page", ["README.md", "docs/adding-a-job.md"])
def test_adding_a_job_counts_the_lines_of_the_real_files(page):
    """The README's and docs/adding-a-job.md's tables give each file of the smallest job with its line count: the
    counts are the files' own (a changed file changes the pages)."""
    rows = re.findall(r"^\| `([\w/]+\.py)` \|.*\| (\d+) \|$", (ROOT / page).read_text(), re.M)
    files = {path: int(n) for path, n in rows if path != "ropim/train/jobs.py"}  # jobs.py: its one entry's lines
    assert len(files) >= 4, rows
    assert {path: len((ROOT / path).read_text().splitlines()) for path in files} == files
