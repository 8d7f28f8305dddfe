"""What a person sees on the terminal: ``ropim.*`` progress lines on stderr."""

from __future__ import annotations

import logging


def ensure_logging() -> None:
    """Show ``ropim.*`` INFO lines (progress, resampling) on stderr when nothing else configured logging."""
    logger = logging.getLogger("ropim")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
