"""Offline installers of pretrained models as plain Hugging Face directories: ``python -m data.models.<name>``."""
