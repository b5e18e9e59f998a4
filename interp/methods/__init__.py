"""The study's methods: records and tensors in, numbers out.

The study's methods, records and tensors in, numbers out: the GA/EA asymmetry, agreement between
oracles, activation and attribution patching with its pairs and sweeps, attention steering, probes,
the judge audit, LoRA training and transfer, cross-judging and the reasoning comparison.
"""
