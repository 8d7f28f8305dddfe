"""Stop signals kept around Ray's calls (``ropim.train.stopping``): a SIGTERM that lands while a job's Ray session
shuts down still stops the job in one line, instead of killing it with its run left RUNNING."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# a job's driver as the command line runs it: the stop handlers installed, a Ray session opened and shut down. A
# watcher reads the kernel's view (Python's signal.getsignal cannot see it: Ray's C++ code changes the disposition):
# once Ray's shutdown has left SIGTERM to the default action and the handler is back, it sends SIGTERM to the process
DRIVER = textwrap.dedent("""
    import os, signal, sys, threading, time
    import ray
    from ropim.tracking.signals import STOP
    from ropim.train.runtime import ray_session

    def killed_by_sigterm():
        caught = next(line for line in open("/proc/self/status") if line.startswith("SigCgt:"))
        return not int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1

    def stop_inside_the_shutdown():
        while not killed_by_sigterm():
            time.sleep(0.001)
        while killed_by_sigterm():
            time.sleep(0.001)
        inside = any(t.name == "ropim-shutdown" for t in threading.enumerate())
        print(f"sent inside the shutdown: {inside}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    STOP.install()
    try:
        with ray_session():
            threading.Thread(target=stop_inside_the_shutdown, daemon=True).start()
        print(f"not stopped, SIGTERM to the default action: {killed_by_sigterm()}", flush=True)
    except KeyboardInterrupt as stop:
        print(f"stopped by {stop}, Ray up: {ray.is_initialized()}, SIGTERM to the default action: "
              f"{killed_by_sigterm()}", flush=True)
        sys.exit(128 + STOP.received)
""")


@pytest.mark.faults
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the signal dispositions from /proc")
def test_a_sigterm_inside_ray_shutdown_stops_the_job_once_ray_is_down(tmp_path):
    job = subprocess.run([sys.executable, "-c", DRIVER], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    # before: the handler never came back (the watcher waited on), the session ended with SIGTERM to the default
    # action: "not stopped, SIGTERM to the default action: True", and a SIGTERM then killed the job (-15, run RUNNING)
    assert job.stdout.splitlines() == [
        "sent inside the shutdown: True",
        "stopped by SIGTERM, Ray up: False, SIGTERM to the default action: False",
    ], job.stdout + job.stderr[-3000:]
    assert job.returncode == 143, job.stderr[-3000:]
