"""The error types a command ends with in one line: bad user input (its message names the input and the fix), and
a run that failed outside the job's code."""


class ConfigError(ValueError):
    """A config value, path or URI the user gave cannot work; raised before expensive work starts."""


class DataError(ConfigError):
    """The data or the storage a job reads or writes is bad for every job that uses it (an image that does not decode,
    a shard cut short, a full disk), not for this job's settings alone: a sweep stops at the first a trial meets."""


class JobFailed(RuntimeError):
    """A run ended FAILED for a reason outside the job's code and input (Ray Train's controller lost, a node out of
    memory); the message says why, what the run kept and how to continue it, in one line."""


def input_line(err: BaseException | None) -> str | None:
    """The one line bad input says (a ``ConfigError``'s message names the input and the fix: its first line, since a
    library may append its own advice below it, as Ray Data does to what its tasks raise); None for any other error,
    and for Ray's error around one (its ``cause``). What a command ends with, without a traceback."""
    if not isinstance(err, ConfigError) or getattr(err, "cause", None) is not None:
        return None
    return (str(err).strip().splitlines() or [None])[0]


def first_line(err: BaseException, limit: int = 300) -> str:
    """An error's first line (its type's name when it has no message), at most ``limit`` characters: how a message
    quotes an error it goes on from."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:limit]
