"""The line a command ends with for bad input: a ConfigError's first line (a library may append its advice below
it), not the line of Ray's error around it, and nothing for any other error."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from ropim.data.decode import BadImageError
from ropim.errors import ConfigError, input_line
from ropim.train.runtime import input_error

LINE = "img7.png: cannot decode image (Truncated File Read); remove or replace the file, or set data.on_bad_image=skip"
# what Ray Data appends to the error a decode task raised (ray.data._internal.util, once its retries are spent)
RAY_DATA_ADVICE = ("\nFailed to apply UDF transform after 1/1 attempts (total backoff 0.0s).\nTo change retry "
                   "attempts, backoff, or which errors are retried, configure `ray.data.DataContext.get_current()`")


def test_bad_input_is_its_first_line_and_nothing_else_is_bad_input():
    assert input_line(BadImageError(LINE)) == LINE
    assert input_line(BadImageError(LINE + RAY_DATA_ADVICE)) == LINE
    assert input_line(ConfigError("")) is None and input_line(RuntimeError(LINE)) is None and input_line(None) is None
    wrapped = RayTaskError("MapBatches(decode_batch)", "Traceback …", BadImageError(LINE)).as_instanceof_cause()
    assert isinstance(wrapped, BadImageError) and input_line(wrapped) is None  # Ray's first line is not the input's


def test_the_driver_finds_the_image_inside_rays_errors_with_its_type():
    inner = RayTaskError("MapBatches(decode_batch)", "Traceback …", BadImageError(LINE + RAY_DATA_ADVICE))
    outer = RayTaskError("SplitCoordinator.get", "Traceback …", inner.as_instanceof_cause()).as_instanceof_cause()
    found = input_error(RuntimeError("Training failed due to worker errors", outer))
    assert type(found) is BadImageError and str(found) == LINE
    assert input_error(RayTaskError("train", "Traceback …", RuntimeError("CUDA error"))) is None
