"""Experiment configs: one `get_config()` per file, table rows as functions of `base`."""
