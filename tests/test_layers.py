"""The layers of DESIGN.md hold in the import graph: the engine (``shotloom``, no Dagster) <-
``resources`` <- ``ops`` <- ``orchestration``; no HTTP type below the API; the API reaches runs
through Dagster (GraphQL), never the ops or resources; the job service (``api.core``) speaks no
dialect and the dialects (``api.r2v``, ``api.openai``) import neither each other nor the store,
the Dagster gateway or the background work (only ``api.core``); the server
YAML's schema (``settings``) and what crosses a process (``contracts``: run tags, stage and progress
events) import nothing above them. The contracts are in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_imports_keep_the_layers():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 kept, 0 broken" in done.stdout, done.stdout
