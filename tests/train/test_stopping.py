"""Stop signals kept around Ray's calls (``ropim.train.stopping``): a SIGTERM that lands while a job's Ray session
shuts down still stops the job in one line, instead of killing it with its run left RUNNING; a stop that lands while
``ray.init`` starts Ray ends the job with its status, instead of a crash in Ray's exit handler."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# a job's driver as the command line runs it: the stop handlers installed, a Ray session opened and shut down. Ray's
# shutdown leaves SIGTERM to the default action, then stops the local cluster's processes: the first of those stops
# waits here until a watcher has sent SIGTERM, once the handler is back. The watcher reads the kernel's view (Python's
# signal.getsignal cannot see it: Ray's C++ code changes the disposition). Waiting on the shutdown's own step, not on
# a sight of the short default window, keeps a busy machine from hiding the window from the watcher
DRIVER = textwrap.dedent("""
    import os, signal, subprocess, sys, threading, time
    import ray
    from ropim.tracking.signals import STOP
    from ropim.train.runtime import ray_session

    stopping, sent = threading.Event(), threading.Event()
    terminate = subprocess.Popen.terminate

    def held_terminate(process):
        if threading.current_thread().name == "ropim-shutdown" and not stopping.is_set():
            stopping.set()
            sent.wait(30)
        terminate(process)

    subprocess.Popen.terminate = held_terminate

    def killed_by_sigterm():
        caught = next(line for line in open("/proc/self/status") if line.startswith("SigCgt:"))
        return not int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1

    def stop_inside_the_shutdown():
        stopping.wait()
        deadline = time.monotonic() + 20
        while killed_by_sigterm() and time.monotonic() < deadline:
            time.sleep(0.001)
        if killed_by_sigterm():
            print("the handler did not come back", flush=True)
        else:
            inside = any(t.name == "ropim-shutdown" for t in threading.enumerate())
            print(f"sent inside the shutdown: {inside}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        sent.set()

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
    # before: the handler never came back ("the handler did not come back", "not stopped, SIGTERM to the default
    # action: True"), and a SIGTERM then killed the job (-15, its run left RUNNING)
    assert job.stdout.splitlines() == [
        "sent inside the shutdown: True",
        "stopped by SIGTERM, Ray up: False, SIGTERM to the default action: False",
    ], job.stdout + job.stderr[-3000:]
    assert job.returncode == 143, job.stderr[-3000:]


# a job's driver as the command line runs it, stopped while ray.init starts Ray: a watcher sends the signal as soon as
# the driver has a child process (Ray's first, started by ray.init). A callback registered before ropim's says whether
# the interpreter's teardown was reached (where a Ray core worker that ray.init left half-built crashed the process)
INIT_DRIVER = textwrap.dedent("""
    import atexit, os, signal, sys, threading, time
    atexit.register(print, "teardown reached", flush=True)
    from ropim.tracking.signals import STOP  # before Ray, as in the command line: its exit callback runs after Ray's
    from ropim.train.runtime import ray_session
    import ray

    def children():
        me = os.getpid()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                yield int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == me
            except OSError:
                pass

    def stop_inside_ray_init():
        while not any(children()):
            time.sleep(0.005)
        print(f"sent inside ray.init: {not ray.is_initialized()}", flush=True)
        os.kill(os.getpid(), signal.Signals[sys.argv[1]])

    STOP.install()
    threading.Thread(target=stop_inside_ray_init, daemon=True).start()
    try:
        with ray_session():
            print("not stopped", flush=True)
    except KeyboardInterrupt as stop:
        print(f"stopped by {stop}, Ray up: {ray.is_initialized()}", flush=True)
        STOP.restore()
        sys.exit(128 + STOP.received)
""")


@pytest.mark.faults
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the driver's children in /proc")
@pytest.mark.parametrize(("signame", "lines", "status"), [
    # held until Ray is up, so Ray's exit hook shuts a whole session down (before: "Ray up: False", the stop raised
    # inside ray.init, which could leave its core worker half-built: exit -11 in Ray's C++ exit handler)
    ("SIGINT", ["stopped by SIGINT, Ray up: True", "teardown reached"], 130),
    # Ray's own handler (sys.exit) cuts ray.init short: the process ends once the atexit callbacks have run, before the
    # teardown (before: "teardown reached", then now and then the same crash)
    ("SIGTERM", ["stopped by SIGTERM, Ray up: False"], 143),
])
def test_a_stop_inside_ray_init_ends_the_job_with_its_status(tmp_path, signame, lines, status):
    job = subprocess.run([sys.executable, "-c", INIT_DRIVER, signame], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert job.stdout.splitlines() == ["sent inside ray.init: True", *lines], job.stdout + job.stderr[-3000:]
    assert job.returncode == status, job.stderr[-3000:]
