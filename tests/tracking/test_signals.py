"""Stop signals that land where Python cannot raise them: the stop is raised again, not lost."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from ropim.tracking.signals import STOP, Interrupted


class Finalizer:
    """An object whose ``__del__`` is running when the stop signal arrives (Python ignores what ``__del__`` raises, as
    it does in an at-fork hook such as ``logging``'s)."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGTERM)
        sum(range(10_000))  # the handler runs here, inside the finalizer


def test_a_stop_raised_inside_a_finalizer_is_raised_again_on_the_main_thread():
    sigterm = signal.getsignal(signal.SIGTERM)
    assert STOP.install()
    try:
        with pytest.raises(Interrupted) as stopped:
            Finalizer()  # dropped at once: its __del__ runs and swallows the first Interrupted
            end = time.monotonic() + 5  # without the redelivery this loop runs to its end: nothing stops the job
            while time.monotonic() < end:
                sum(range(10_000))
        assert stopped.value.name == "SIGTERM" and STOP.received == signal.SIGTERM
    finally:
        STOP.restore()
    # the handlers and the hook given back
    assert getattr(sys.unraisablehook, "__self__", None) is not STOP and signal.getsignal(signal.SIGTERM) is sigterm


def test_other_unraisable_errors_still_reach_the_previous_hook():
    seen = []
    hook, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        assert STOP.install()
        try:
            class Broken:
                def __del__(self) -> None:
                    raise ValueError("in a finalizer")

            Broken()
        finally:
            STOP.restore()
        assert [type(r.exc_value) for r in seen] == [ValueError]
    finally:
        sys.unraisablehook = hook


# A finished command's teardown, as a program: an atexit callback as slow as Ray's shutdown (registered after the
# stop handlers, so it runs before their last callback), then a module finalizer as slow as a big library's.
TEARDOWN = """
import atexit, os, sys, time
from ropim.tracking.signals import STOP

class Slow:
    def __del__(self):
        os.write(1, b"finalizing\\n")
        time.sleep(1.5)

keep = Slow()
STOP.install()
atexit.register(lambda: (os.write(1, b"atexit\\n"), time.sleep(1.5)))
STOP.finished()
print("done", flush=True)
"""


@pytest.mark.parametrize("phase", ["atexit", "finalizing"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_a_finished_commands_teardown_ends_it_with_status_0(phase, sig):
    """Before, a stop signal that arrived once Python had dropped its handlers (the modules' finalizers, after the
    atexit callbacks) killed the finished process by the default action, with no word: status -2 or -15."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", TEARDOWN], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.decode().strip() == phase:
            proc.send_signal(sig)
            break
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"Traceback" not in err, (proc.returncode, err.decode()[-1500:])
