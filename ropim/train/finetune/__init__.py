"""The fine-tuning job (``ropim finetune``): ``config.py`` (FinetuneConfig), ``task.py`` (FinetuneTask: a classifier
from an encoder with the paper's recipe), ``register.py`` (per-class results, the classifier registered).
``ropim.train.driver.run(FinetuneConfig(...))`` runs it."""
