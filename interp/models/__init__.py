"""A model and the facts of its architecture.

A model and the facts of its architecture: loading by alias, path or hub id and its provenance
(:mod:`interp.models.loading`), the GGUF reader (:mod:`interp.models.gguf`), model files
(:mod:`interp.models.files`), hook-point names and where they sit (:mod:`interp.models.points`),
devices (:mod:`interp.models.devices`) and the KV cache every forward shares
(:mod:`interp.models.kv_cache`).
"""
