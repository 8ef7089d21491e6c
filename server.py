#!/usr/bin/env python
"""Start the whole service from one server YAML: ``python server.py --config ...`` from a checkout,
the same as the installed ``shotloom serve --config ...`` (:mod:`orchestration.supervisor`)."""

import sys

from orchestration.supervisor import main

if __name__ == "__main__":
    sys.exit(main())
