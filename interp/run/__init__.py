"""Running studies as a whole.

Running studies as a whole: an experiment config through every stage (:mod:`interp.run.pipeline`),
models side by side (:mod:`interp.run.compare`),
the cross-judging grid (:mod:`interp.run.cross_grid`) and one record's page
(:mod:`interp.run.view`).
"""
