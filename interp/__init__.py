"""interp: is an LLM a better judge than a generator, and what happens inside it when it judges?

A mechanistic-interpretability toolkit for the task asymmetry between generation and
self-evaluation on in-context QA (Bandyopadhyay 2026, arXiv 2606.28050): GA/EA harness,
last-token attention span mass, activation patching, LoRA transfer and probes.
"""

__version__ = "0.1.0"
