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


def said_in_one_line(err: BaseException | None) -> bool:
    """Whether ``err`` is bad input said in one line (a ``ConfigError`` whose message names the input and the fix):
    what a command ends with, without a traceback."""
    return isinstance(err, ConfigError) and bool(str(err).strip()) and "\n" not in str(err).strip()


def first_line(err: BaseException, limit: int = 300) -> str:
    """An error's first line (its type's name when it has no message), at most ``limit`` characters: how a message
    quotes an error it goes on from."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:limit]
