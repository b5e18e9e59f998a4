"""Running a model as generator and as judge.

Running a model as generator and as judge: prompts and spans, the one prefill per prompt,
generation, the verdict score, answer parsing and grading (oracles and their rules), the judge
(:mod:`interp.judging.judge`), the reasoning judge and the pooled residual-stream features read in
the same forward.
"""
