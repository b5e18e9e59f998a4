"""The foundation every room stands on.

The foundation every room stands on: errors, names, JSON lines and atomic writes, progress, the
layer grammar, token strings, config reading and options, and the stage contract. Imports nothing
of interp outside this room, and no torch at import.
"""
