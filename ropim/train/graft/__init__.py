"""The LGP-ROPIM graft (``ropim graft``): ``config.py`` (GraftConfig), ``task.py`` (GraftTask: MoCo v3 on an encoder,
LGP's layer-wise rates), ``register.py`` (the grafted encoder registered with its lineage).
``ropim.train.driver.run(GraftConfig(...))`` runs it."""
