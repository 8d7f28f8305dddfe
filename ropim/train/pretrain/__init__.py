"""The pretraining job (``ropim pretrain``): ``config.py`` (PretrainConfig), ``task.py`` (PretrainTask: ROPIM on the
one loop), ``register.py`` (the final encoder registered). ``ropim.train.driver.run(PretrainConfig(...))`` runs it."""
