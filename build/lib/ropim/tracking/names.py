"""Names shared by the jobs and the registry (no imports: configs read them at parse time)."""

DEFAULT_ENCODER_NAME = "ropim-encoder"
DEFAULT_CLASSIFIER_NAME = "ropim-classifier"
CHAMPION = "champion"
