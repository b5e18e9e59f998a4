"""Experiment configs and the studies written against interp (not part of the package)."""
