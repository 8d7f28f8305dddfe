"""Stop signals: SIGINT (Ctrl+C) and SIGTERM (``kill``, ``ray job stop``, Kubernetes, batch schedulers) end a job's run
as KILLED — never as a crash, never left RUNNING.

While a run is open (``ropim.tracking.runs.open_run``) the process's main thread handles both: the first signal
raises ``Interrupted`` (a ``KeyboardInterrupt``) there, which unwinds the job — Ray Train workers stop with their
driver, checkpoints already complete stay, nothing is registered — to ``Run.__exit__``, which marks the run KILLED
and prints how to continue it. A second signal exits at once (status 128 + the signal's number), recording nothing
more. A first signal that arrives during a call on the tracking store (``deferred``) is raised when the call returns,
so that a write is never cut in half (an interrupted sqlite commit keeps the store locked, and the run could not be
marked KILLED). Libraries that replace the handlers while they run (``ray.init`` for SIGTERM, Ray Train's ``fit``
on the main thread for SIGINT) are kept from doing so by their callers (``ropim.train.runtime``).

A stop must survive landing anywhere. Python ignores an exception raised where it cannot propagate (an at-fork hook
such as ``logging``'s, a ``__del__``, a weakref callback) and reports it to ``sys.unraisablehook``: while the handlers
are installed, an ``Interrupted`` reported there is raised again on the main thread a moment later,
so the job stops instead of running on with the signal spent. A job whose code turns the interrupt into another
error still ends KILLED (``received``).

Once a command has finished (``finished``: its result recorded and printed), the interpreter's teardown (threads,
``atexit`` callbacks such as Ray's shutdown, the modules' finalizers) may still take seconds. A stop signal then ends
the process at once with status 0, as nothing is left to stop. Python drops its signal handlers late in the teardown,
after the ``atexit`` callbacks, so from the last callback on the stop signals are ignored (a signal left to the
default action would kill the finished process with no word, status −2 or −15). A stop that cut a library's start
short (``deliver``) ends the process once the ``atexit`` callbacks have run, skipping the teardown after them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REDELIVER_S = 0.05  # a stop Python dropped is raised again this long after (dropped again: again)


def end_now(status: int) -> None:
    """End the process with ``status`` at once, its console output flushed (no teardown after)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the job's driver."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class StopSignals:
    """The handlers of this process while a run is open: the first stop signal raises, a second exits at once."""

    def __init__(self) -> None:
        self.previous: dict[int, object] | None = None
        self.received: int | None = None
        self.depth = 0  # the main thread's open ``deferred`` blocks
        self.held = False  # a signal arrived inside one: raised when the outermost ends
        self.again = False  # the next handler call raises the received signal again (it was swallowed)
        self.hook = None  # sys.unraisablehook before ``install``
        self.reported = False  # a run said how the stop ended it (``ropim.tracking.runs.Run``)
        self.timer: threading.Timer | None = None  # a dropped stop, to be raised again
        self.done = False  # the command finished: only the interpreter's teardown is left (``finished``)
        self.cut = False  # a stop cut a library's start short (``deliver``): the process ends after atexit
        atexit.register(self.at_exit)  # at import, before the libraries': it runs after theirs (last in, first out)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.again:
            self.again = False
            signum = self.received
        elif self.received is not None:
            os._exit(128 + signum)  # a second signal: at once, as the user asked
        self.received = signum
        if self.depth:
            self.held = True
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Run the block whole: a first stop signal that arrives on the main thread inside it is raised as it ends
        (a second still exits at once). Other threads are never interrupted: there the block runs as it is."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self.held:
                self.held = False
                raise Interrupted(self.received)

    def install(self) -> bool:
        """Handle the stop signals from now on; False (nothing done) off the main thread or when already handling
        them (a run opened inside another)."""
        if threading.current_thread() is not threading.main_thread() or self.previous is not None:
            return False
        self.previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        self.received, self.held, self.again, self.reported, self.cut = None, False, False, False, False
        for s in STOP_SIGNALS:
            signal.signal(s, self.handle)
        self.hook, sys.unraisablehook = sys.unraisablehook, self.unraisable
        return True

    def unraisable(self, report) -> None:
        """``sys.unraisablehook`` while installed: an ``Interrupted`` Python had to drop is raised again on the main
        thread; anything else goes to the previous hook."""
        if isinstance(report.exc_value, Interrupted) and self.received is not None:
            self.again = True  # the next SIGINT raises the received signal; sent once the main thread has left
            self.timer = threading.Timer(REDELIVER_S, signal.raise_signal, (signal.SIGINT,))  # the code that dropped it
            self.timer.daemon = True
            self.timer.start()
        else:
            self.hook(report)

    def deliver(self, signum: int) -> None:
        """A stop signal that a library's own handler caught, cutting the library's start short (``ray.init`` exits on
        SIGTERM): handled as ours, and the process ends with the stop's status once the ``atexit`` callbacks have run
        (Ray's shutdown among them), before the interpreter's and the C libraries' teardown, where a half-built Ray
        core worker crashes it (``at_exit``)."""
        if self.previous is None:
            raise Interrupted(signum)
        self.cut = True
        self.handle(signum, None)

    def name(self, err: BaseException | None = None) -> str:
        """The stop signal that ended the job: ``err``'s, else the one received (libraries that catch the
        interrupt re-raise a plain KeyboardInterrupt), else SIGINT."""
        return signal.Signals(getattr(err, "signum", None) or self.received or signal.SIGINT).name

    def finished(self) -> None:
        """The command is done: a stop signal from now on ends the process at once, with status 0."""
        self.done = True
        for s in STOP_SIGNALS:
            signal.signal(s, self.leave)

    @staticmethod
    def leave(signum: int, frame: FrameType | None) -> None:
        end_now(0)

    def at_exit(self) -> None:
        """The last ``atexit`` callback of ours: a finished command ignores the stop signals while Python finalizes,
        which it does without its signal handlers; a stopped one whose library start was cut short ends here."""
        if self.cut:
            logging.shutdown()
            end_now(128 + self.received)
        if self.done:
            for s in STOP_SIGNALS:
                signal.signal(s, signal.SIG_IGN)

    def restore(self) -> None:
        """Give the stop signals back to the handlers they had before ``install``."""
        if self.previous is None:
            return
        if self.timer is not None:
            self.timer.cancel()
        for s, previous in self.previous.items():
            signal.signal(s, previous)
        sys.unraisablehook, self.previous = self.hook, None


STOP = StopSignals()  # one per process: signals are process-wide
