"""Stop signals kept with the job around Ray's calls that would take them (``ropim.tracking.signals``): ``ray.init``
installs its own SIGTERM handler and must not be cut short, Ray Train's ``fit`` on the main thread installs its own
SIGINT handler, and ``ray.shutdown`` leaves SIGTERM to the default action (which kills the process with no word)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from ropim.tracking.signals import STOP

T = TypeVar("T")


@contextlib.contextmanager
def init_kept() -> Iterator[None]:
    """Around ``ray.init``: a stop signal meanwhile is held until Ray is up, then raised, so that Ray's exit hook shuts
    a whole session down. A stop that cut ``ray.init`` short could leave Ray's core worker half-built, out of reach of
    ``ray.shutdown``: its C++ exit handler then crashed the stopped process (status −11, after its stop line).

    ``ray.init`` also installs its own SIGTERM handler (``sys.exit(15)``) for good as it starts, so a SIGTERM can still
    cut it short: it is handled as a stop signal, the process ends as soon as Python's exit callbacks have run
    (``STOP.deliver``), and the caller's handler comes back after. Ray's core worker also installs a C++ failure
    handler for SIGTERM as it starts; one that caught the signal arms a 3 s alarm that would abort the job's orderly
    stop (status −6 after its stop line): it is cancelled."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with STOP.deferred():
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
    return beside_main(trainer.fit, tick=0.5)


def shutdown_kept() -> None:
    """``ray.shutdown()`` with SIGTERM still handled. Part-way, Ray's core worker sets SIGTERM to the default action in
    the kernel (Python's ``signal.getsignal`` still names the handler), then Ray stops the local cluster's processes,
    each given up to 1 s: a SIGTERM then killed the job with no word, its run left RUNNING. The shutdown runs in a
    helper thread while the main thread installs the handler again every 10 ms; a stop signal meanwhile is raised
    once Ray is down (``STOP.deferred``)."""
    import ray

    if threading.current_thread() is not threading.main_thread():
        ray.shutdown()
        return
    handler = signal.getsignal(signal.SIGTERM)
    with STOP.deferred():
        try:
            beside_main(ray.shutdown, tick=0.01, between=lambda: signal.signal(signal.SIGTERM, handler))
        finally:  # before a stop held meanwhile is raised
            signal.signal(signal.SIGTERM, handler)


def beside_main(call: Callable[[], T], tick: float, between: Callable[[], object] | None = None) -> T:
    """``call()`` in a helper thread while the main thread waits, running ``between`` every ``tick`` seconds (stop
    signals reach the main thread's handlers while it waits); its result returned, its exception raised here. Off the
    main thread, ``call()`` as it is."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = call()
        except BaseException as err:  # handed to the main thread
            outcome["error"] = err

    helper = threading.Thread(target=target, name=f"ropim-{getattr(call, '__name__', 'call')}", daemon=True)
    helper.start()
    while helper.is_alive():
        if between is not None:
            between()
        helper.join(tick)  # a stop signal raises here (unless deferred); Ray Train's workers stop with this driver
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
