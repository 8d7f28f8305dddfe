"""The segmentation transfer (``ropim segment``): ``config.py`` (SegmentConfig), ``task.py`` (SegmentTask: UperNet on
an encoder), ``register.py`` (per-class IoU, a picture, the segmenter registered).
``ropim.train.driver.run(SegmentConfig(...))`` runs it."""
