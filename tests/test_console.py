"""What the terminal shows: Ray's and MLflow's internal lines dropped, every other line (and the job's errors) kept."""

import io

from ropim.console import NoiseFilter

RAY_TIMEOUT_WARNING = """\
Failed to send resource request for train-dd17941a. If this only happens transiently during network partition or \
CPU being overloaded, it's safe to ignore this error. If this error persists, file a GitHub issue.
Traceback (most recent call last):
  File "/x/ray/train/v2/_internal/execution/scaling_policy/autoscaling_coordinator_client.py", line 58, in send
    ray.get(
  File "python/ray/includes/common.pxi", line 107, in ray._raylet.check_status
ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.
"""


def shown(text: str, chunk: int = 7) -> str:
    out = io.StringIO()
    f = NoiseFilter(out)
    for i in range(0, len(text), chunk):  # lines arrive in pieces
        f.write(text[i:i + chunk])
    f.flush()
    return out.getvalue()


def test_internal_lines_dropped_job_lines_kept() -> None:
    text = ("[pretrain] epoch 1/2 loss 1.0\n"
            "(pid=1) E 2026 core_worker.cc:123: Actor with class name: 'PreemptionWatcher' has max_restarts > 0\n"
            "Created version '3' of model 'ropim-encoder'.\n"
            "[pretrain] registered encoder models:/ropim-encoder/3\n")
    assert shown(text) == "[pretrain] epoch 1/2 loss 1.0\n[pretrain] registered encoder models:/ropim-encoder/3\n"


def test_warning_dropped_with_its_traceback_only() -> None:
    job_error = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in step\n"
                 "ValueError: the job's own error\n")
    text = "[pretrain] epoch 1/2 loss 1.0\n" + RAY_TIMEOUT_WARNING + "[pretrain] epoch 2/2 loss 0.9\n" + job_error
    assert shown(text) == "[pretrain] epoch 1/2 loss 1.0\n[pretrain] epoch 2/2 loss 0.9\n" + job_error


def test_line_after_warning_without_traceback_is_kept() -> None:
    text = RAY_TIMEOUT_WARNING.splitlines()[0] + "\n[pretrain] epoch 2/2 loss 0.9\n"
    assert shown(text) == "[pretrain] epoch 2/2 loss 0.9\n"


def test_cleaner_thread_traceback_dropped() -> None:
    text = ("Exception in thread PlacementGroupCleanerMonitor:\nTraceback (most recent call last):\n"
            '  File "/x/threading.py", line 1045, in _bootstrap_inner\n    self.run()\n'
            "ConnectionError: Found multiple active Ray instances: {'a:1', 'b:2'}. Please specify the one\n"
            "[pretrain] epoch 1/2 loss 1.0\n")
    assert shown(text) == "[pretrain] epoch 1/2 loss 1.0\n"
