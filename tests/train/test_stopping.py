"""Stop signals kept around Ray's calls (``ropim.train.stopping``): after a job's Ray session shuts down, and while it
does, a SIGTERM still stops the job in one line instead of killing it with its run left RUNNING."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

# a job's driver as the command line runs it: the stop handlers installed, a Ray session opened and shut down; a
# watcher measures the longest stretch in which the kernel would kill the process on SIGTERM (Python's
# signal.getsignal cannot see it: Ray's C++ code changes the disposition), then the job waits to be stopped
DRIVER = textwrap.dedent("""
    import signal, sys, threading, time
    from ropim.tracking.signals import STOP
    from ropim.train.runtime import ray_session

    def killed_by_sigterm():
        caught = next(line for line in open("/proc/self/status") if line.startswith("SigCgt:"))
        return not int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1

    longest, watching = [0.0], threading.Event()

    def watch():
        since = None
        while watching.is_set():
            if killed_by_sigterm():
                since = since or time.monotonic()
                longest[0] = max(longest[0], time.monotonic() - since)
            else:
                since = None
            time.sleep(0.001)

    STOP.install()
    with ray_session():
        watching.set()
        threading.Thread(target=watch, daemon=True).start()
    watching.clear()
    try:  # the stop may land as soon as the line is out
        print(f"down {longest[0]:.3f} {int(killed_by_sigterm())}", flush=True)
        time.sleep(120)
    except KeyboardInterrupt as stop:
        print(f"stopped by {stop}", flush=True)
        sys.exit(128 + STOP.received)
""")


@pytest.mark.faults
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the signal dispositions from /proc")
def test_a_sigterm_during_and_after_ray_shutdown_still_stops_the_job(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        line = job.stdout.readline()
        assert line.startswith("down "), line + job.stderr.read()[-3000:]
        _, longest, after = line.split()
        # before: Ray left SIGTERM to the default action from its core worker's shutdown on (about 1.4 s inside
        # ray.shutdown on 2 cores, then for good): the job died with -15, its run RUNNING
        assert after == "0" and float(longest) < 0.5, line
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in out, (job.returncode, out, err[-3000:])
