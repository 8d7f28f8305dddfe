"""One module per source format, each serving classification and segmentation alike where the format holds both:
``detect`` (a local path in this format?), ``check`` (the cheap pre-flight of a source) and ``open`` (its splits,
listed). ``ropim.data.sources`` picks the format; ``ropim.data.formats.common`` holds what they share."""
