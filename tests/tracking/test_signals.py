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
