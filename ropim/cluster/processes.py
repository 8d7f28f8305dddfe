"""Which processes are ours, and stopping exactly those (psutil).

A server is started in a new session (``start_new_session``), so its session id is the pid recorded in
``<name>.sid``; every daemon and worker it starts stays in that session (Ray's workers get their own process group,
not their own session). Ours are: the members of a recorded session, all their descendants (Ray's job drivers call
``setsid`` themselves) and, for Ray, any process of this user with a flag (``--temp-dir=...``, ``--session-dir=...``)
that points into our private Ray temp dir. Linux hands out no pid that is still in use as a session id, so a recorded
id cannot name someone else's processes while one of ours lives; once all are gone the number can be recycled, so a
session only counts as ours while one member matches a recorded (pid, start time) pair in ``<name>.pids`` or names
our directories on its command line.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def members(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid``."""
    return [p for p in psutil.process_iter() if session_of(p.pid) == sid]


def identity(p: psutil.Process) -> str:
    """``pid start-time``: unique on this machine, unlike the pid alone."""
    return f"{p.pid} {p.create_time():.2f}"


def cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def descendants(roots: list[psutil.Process]) -> list[psutil.Process]:
    found = []
    for root in roots:
        try:
            found += root.children(recursive=True)
        except psutil.Error:
            continue
    return found


def unique(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Each process once, never this one, in pid order."""
    by_pid = {p.pid: p for p in procs if p.pid != os.getpid()}
    return [by_pid[pid] for pid in sorted(by_pid)]


def stop(procs: list[psutil.Process], grace: float, say=print) -> None:
    """SIGTERM ``procs``, wait up to ``grace`` seconds, SIGKILL the survivors (psutil checks each is still the
    process it was, so a recycled pid is never signalled)."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace)
    if alive:
        say(f"SIGKILL after {grace:g}s: {' '.join(str(p.pid) for p in alive)}")
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                continue


@dataclass(frozen=True)
class Service:
    """One server we start: its records (``<dir>/<name>.sid``, ``<dir>/<name>.pids``) and the directories whose
    mention on a command line marks a process as ours; ``temp_dir``: Ray's private temp dir (flags into it mark
    processes that left our session)."""

    name: str
    folder: Path
    ours_dirs: tuple[Path, ...]
    temp_dir: Path | None = None

    @property
    def sid_file(self) -> Path:
        return self.folder / f"{self.name}.sid"

    @property
    def snapshot_file(self) -> Path:
        return self.folder / f"{self.name}.pids"

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """Start ``argv`` in a new session (its pid is the session id, recorded at once), output into ``log``."""
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.sid_file.write_text(f"{proc.pid}\n")
        self.snapshot()
        return proc

    def snapshot(self) -> None:
        """Record the identities of the session's members now."""
        sid = self.recorded_sid()
        procs = members(sid) if sid is not None else []
        lines = []
        for p in procs:
            try:
                lines.append(identity(p))
            except psutil.Error:
                continue
        self.snapshot_file.write_text("".join(line + "\n" for line in lines))

    def recorded_sid(self) -> int | None:
        try:
            return int(self.sid_file.read_text())
        except (OSError, ValueError):
            return None

    def mentions_us(self, p: psutil.Process) -> bool:
        args = " ".join(cmdline(p))
        return any(f"{d}/" in args for d in self.ours_dirs)

    def alive_sid(self) -> int | None:
        """The recorded session id if that session is alive and ours (see the module's docstring)."""
        sid = self.recorded_sid()
        if sid is None:
            return None
        try:
            known = set(self.snapshot_file.read_text().splitlines())
        except OSError:
            known = set()
        for p in members(sid):
            try:
                if identity(p) in known or self.mentions_us(p):
                    return sid
            except psutil.Error:
                continue
        return None

    def in_temp_dir(self) -> list[psutil.Process]:
        """This user's processes with a flag that points into ``temp_dir`` (``--temp-dir=...``, as Ray's daemons
        and workers have; a bare path, as in ``tail -f .../raylet.out``, does not count)."""
        if self.temp_dir is None:
            return []
        flag = f"={self.temp_dir}"
        found = []
        for p in psutil.process_iter():
            try:
                if p.uids().effective != os.geteuid():
                    continue
            except psutil.Error:
                continue
            if any(a.endswith(flag) or f"{flag}/" in a for a in cmdline(p)):
                found.append(p)
        return unique(found)

    def processes(self) -> list[psutil.Process]:
        """Every process of this service: its session's members, the temp-dir matches, and all their descendants."""
        sid = self.alive_sid()
        base = (members(sid) if sid is not None else []) + self.in_temp_dir()
        return unique(base + descendants(base))

    def forget(self) -> None:
        self.sid_file.unlink(missing_ok=True)
        self.snapshot_file.unlink(missing_ok=True)
