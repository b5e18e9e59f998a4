"""Analyses over stored records that need no model.

Analyses over stored records that need no model: the passage (cluster) bootstrap behind every CI,
folds and tests (:mod:`interp.analysis.stats`), and last-token attention span mass
(:mod:`interp.analysis.span_mass`).
"""
