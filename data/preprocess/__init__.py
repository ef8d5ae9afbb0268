"""Offline converters from public data sets to ColoRL's (verl's) row layout: ``python -m data.preprocess.<name>``."""
