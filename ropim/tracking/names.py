"""Names shared by the jobs and the registry (standard library only: configs read them at parse time)."""

import secrets
import time

DEFAULT_ENCODER_NAME = "ropim-encoder"
DEFAULT_CLASSIFIER_NAME = "ropim-classifier"
DEFAULT_SEGMENTER_NAME = "ropim-segmenter"
CHAMPION = "champion"


def default_run_name(prefix: str) -> str:
    """``<prefix>-<YYYYmmdd-HHMMSS>-<4 hex>``: unique even for jobs started in the same second."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
