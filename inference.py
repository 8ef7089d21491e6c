#!/usr/bin/env python
"""Standalone generation from an inference YAML, no Dagster: ``python inference.py ...`` from a
checkout, the same as the installed ``shotloom generate ...`` (:mod:`shotloom.generate`)."""

import sys

from shotloom.generate import main

if __name__ == "__main__":
    sys.exit(main())
