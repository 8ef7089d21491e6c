"""Model families, imported lazily (each pulls in diffusers and torch)."""

from __future__ import annotations

from importlib import import_module

FAMILIES = {"wan": "shotloom.families.wan:WanAdapter", "ltx2": "shotloom.families.ltx2:LTX2Adapter"}


def adapter_class(family: str):
    try:
        module, name = FAMILIES[family].split(":")
    except KeyError:
        raise ValueError(f"family: unknown model family {family!r}; known: {sorted(FAMILIES)}") from None
    return getattr(import_module(module), name)
