"""shotloom engine: model families, sampler, tiled decode, conditioning cache and media I/O.

Plain Python + torch; nothing in this package imports Dagster, so ``inference.py``
and the device workers can use it alone. Heavy modules (torch, diffusers) are
imported by the submodules that need them, never here.
"""

ENV_PREFIX = "SHOTLOOM"
__version__ = "0.1.0"
