"""Probes of compiler behaviour behind a workaround (what XLA lowers a quantized dot to)."""
