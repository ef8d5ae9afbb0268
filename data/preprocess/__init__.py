"""Offline converters from public data sets to ColoRL's row layout: ``python -m data.preprocess.<name>``."""
