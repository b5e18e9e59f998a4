"""``python -m interp``: the same command line as the ``interp`` console script.

Launchers that start a module rather than a script (``torchrun -m interp``, ``python -m interp``)
reach :func:`interp.cli.main` through this file.
"""

from interp.cli import main

main()
