"""Stop signals kept with the job around Ray's calls that would take them (``ropim.tracking.signals``): ``ray.init``
installs its own SIGTERM handler, Ray Train's ``fit`` on the main thread its own SIGINT handler."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from ropim.tracking.signals import STOP


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """Around ``ray.init``, which installs its own SIGTERM handler (``sys.exit(15)``) for good as it starts: a SIGTERM
    meanwhile is handled as a stop signal (``ropim.tracking.signals``), and the caller's handler comes back after.
    Ray's core worker also installs a C++ failure handler for SIGTERM as it starts; one that caught the signal arms a
    3 s alarm that would abort the job's orderly stop (status −6 after its stop line): it is cancelled."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as err:
        if err.code != signal.SIGTERM or signal.getsignal(signal.SIGTERM) is handler:
            raise
        STOP.deliver(signal.SIGTERM)
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
        if STOP.received == signal.SIGTERM:  # Ray's C++ failure handler saw it too: its 3 s abort alarm cancelled
            signal.alarm(0)


def fit_trainer(trainer):
    """``trainer.fit()``; called from the main thread, it runs in a helper thread and the main thread waits, so that
    stop signals reach the run's handlers (``ropim.tracking.signals``): Ray Train's ``fit`` on the main thread
    replaces the SIGINT handler with its own, which aborts the run as a crash."""
    if threading.current_thread() is not threading.main_thread():
        return trainer.fit()
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as err:  # handed to the main thread
            outcome["error"] = err

    helper = threading.Thread(target=target, name="ropim-fit", daemon=True)
    helper.start()
    while helper.is_alive():
        helper.join(0.5)  # a stop signal raises here; the workers then stop with this driver
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
