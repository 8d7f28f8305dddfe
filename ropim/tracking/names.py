"""Names shared by the jobs and the registry (standard library only: configs read them at parse time)."""

import secrets
import time

DEFAULT_ENCODER_NAME = "ropim-encoder"
DEFAULT_CLASSIFIER_NAME = "ropim-classifier"
DEFAULT_SEGMENTER_NAME = "ropim-segmenter"
CHAMPION = "champion"
WIDTH_TAGS = {"vit_tiny_patch16_224": "vit_t", "vit_small_patch16_224": "vit_s", "vit_base_patch16_224": "vit_b"}


def model_alias(width: str, patch_size: int, img_size: int, alias: str = CHAMPION) -> str:
    """The champion among encoders of one width, patch and image size, e.g. ``champion-vit_b16-224``: what the paper
    presets fine-tune, graft and segment by default, so that a champion of another shape (a 32-px digits encoder)
    can never be picked up by a 224-px job."""
    return f"{alias}-{WIDTH_TAGS.get(width, width)}{patch_size}-{img_size}"


def default_run_name(prefix: str) -> str:
    """``<prefix>-<YYYYmmdd-HHMMSS>-<4 hex>``: unique even for jobs started in the same second."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
