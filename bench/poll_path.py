#!/usr/bin/env python
"""The pollers' whole path inside the API, in process: CPU per ``GET /version/{id}`` and per
``GET /v1/videos/{id}`` through the ASGI app that ``python -m api`` builds (FastAPI, the fast-path
middleware, the cached view, the response), without sockets, uvicorn or the rest of the service.

``bench/api.py`` measures the poll over real HTTP while two CPU workers compute on the same 2 cores,
so its p99 moves by 2x between identical runs: it shows the whole, not a change of a few
microseconds in the API's own code. This shows that part alone: microseconds per request with 1
and with 10 requests per turn of the event loop (a cached view looks at the store once a turn, and
uvicorn gives a turn as many requests as have arrived), the best of ``--repeats`` runs.

The jobs polled are a real service's: ``bench/api.py --keep`` (a short run) starts the whole service,
accepts jobs of both dialects and leaves its state (queued, running and finished jobs); each
measurement builds the app on a copy of it (the app's background threads are not started, so the
jobs stay as they are).

With ``--baseline REV`` the state is made by REV's own ``bench/api.py`` (in a temporary worktree) and
the same measurement runs on REV's tree and on this one (which migrates its copy of the store
forward), each in a process of its own, ``--rounds`` times in alternating order; the RESULT line has
this tree's medians and REV's as ``baseline_*``.

    python bench/poll_path.py [--requests 5000] [--repeats 5] [--baseline REV [--rounds 3]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The tree measured is the one first on the import path (this checkout, or another on PYTHONPATH):
# this checkout and the script's own folder go last (there bench/api.py cannot stand for the api
# package).
_BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH] + [str(_BENCH.parent), str(_BENCH)]

from _common import REPO, result_line  # noqa: E402

PER_TURN = (1, 10)
ROUTES = {"version": "/version/", "v1": "/v1/videos/"}
# A short bench/api.py run: enough jobs of each dialect in each state, little else.
STATE_RUN = ["--keep", "--requests", "10", "--v1-requests", "10", "--seconds", "1", "--burst", "5"]
STATE_RUN += ["--merges", "1"]


# -- one measurement, in this process, of the tree first on the import path -------------------------
def _scope(path: str) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8221"), (b"accept", b"*/*")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8221),
        "state": {},
    }


def _polled_ids(state_dir: Path) -> dict[str, list[str]]:
    """The ids a poller of each dialect uses: an R2V job's version id, a /v1 video's id."""
    db = sqlite3.connect(f"file:{state_dir / 'api' / 'service.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT version_id, shot_id, dialect FROM jobs WHERE kind = 'r2v'").fetchall()
    finally:
        db.close()
    return {
        "version": [version for version, _, dialect in rows if dialect == "r2v"],
        "v1": [shot for _, shot, dialect in rows if dialect != "r2v"],
    }


def measure(config: Path, requests: int, repeats: int) -> dict[str, float]:
    import logging

    from api.__main__ import build_context
    from api.app import create_app
    from settings.server import ServerConfig

    logging.disable(logging.WARNING)
    cfg = ServerConfig.load(config)
    app = create_app(build_context(cfg))
    ids = _polled_ids(cfg.state_dir)
    statuses: dict[int, int] = {}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] = statuses.get(message["status"], 0) + 1

    async def run(paths: list[str], per_turn: int) -> float:
        scopes = [_scope(p) for p in paths]
        start, i = time.process_time(), 0
        while i < requests:
            for _ in range(per_turn):
                await app(dict(scopes[i % len(scopes)]), receive, send)
                i += 1
            await asyncio.sleep(0)  # the turn ends: the next request is another turn's
        return (time.process_time() - start) / requests * 1e6

    async def main() -> dict[str, float]:
        figures = {}
        for route, prefix in ROUTES.items():
            if not ids[route]:
                raise SystemExit(f"no {route} jobs in {cfg.state_dir}")
            paths = [prefix + i for i in ids[route]]
            await run(paths, 10)  # warm: every view rendered and cached
            for per_turn in PER_TURN:
                runs = [await run(paths, per_turn) for _ in range(repeats)]
                figures[f"{route}_turn{per_turn}_us"] = round(min(runs), 1)
        return figures

    try:  # the loop uvicorn runs the API on where uvloop is installed (its "auto")
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        figures = runner.run(main())
    if set(statuses) != {200}:
        raise SystemExit(f"polls answered {statuses}, not only 200")
    return figures


# -- the driver: states, trees, rounds ---------------------------------------------------------------
def make_state(tree: Path) -> Path:
    """A short run of ``tree``'s bench/api.py, its state kept: the folder it made."""
    out = subprocess.run(
        [sys.executable, str(tree / "bench" / "api.py"), *STATE_RUN],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    kept = re.search(r"^kept (\S+)$", out.stdout, re.M)
    if out.returncode or kept is None:
        raise RuntimeError(f"{tree}/bench/api.py made no state:\n{out.stdout[-3000:]}")
    return Path(kept.group(1))


def copy_state(root: Path) -> Path:
    """A copy of a kept bench root, its YAML files pointing into the copy."""
    copy = Path(tempfile.mkdtemp(prefix="shotloom-poll-path-"))
    shutil.copytree(root, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
    for yaml_file in copy.rglob("*.yaml"):
        yaml_file.write_text(yaml_file.read_text().replace(str(root), str(copy)))
    return copy


def measure_tree(tree: Path, root: Path, requests: int, repeats: int) -> dict[str, float]:
    """This script's measurement of ``tree``'s app, in a process of its own, on a copy of ``root``."""
    copy = copy_state(root)
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--measure", str(copy / "server.yaml"), "--requests", str(requests),
             "--repeats", str(repeats)],
            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, text=True,
            check=True,
        )  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=5000, help="requests per run")
    p.add_argument("--repeats", type=int, default=5, help="runs per figure (the best is kept)")
    p.add_argument("--baseline", metavar="REV", help="also measure git revision REV, side by side")
    p.add_argument("--rounds", type=int, default=3, help="with --baseline: measurements of each tree")
    p.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # one measurement, this process
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.requests, args.repeats)))
        return

    base = Path(tempfile.mkdtemp(prefix="shotloom-poll-path-base-")) if args.baseline else None
    root = None
    try:
        if base is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.baseline],
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        print(f"the service's state, from {args.baseline or 'this tree'}'s bench/api.py ...", flush=True)
        root = make_state(base or REPO)
        trees = {"this tree": REPO, **({args.baseline: base} if base is not None else {})}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for i in range(args.rounds if base is not None else 1):
            order = list(trees) if i % 2 else list(reversed(trees))
            for name in order:
                figures = measure_tree(trees[name], root, args.requests, args.repeats)
                runs[name].append(figures)
                print(
                    f"round {i + 1}, {name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()), flush=True
                )
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
        if base is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    medians = {k: round(statistics.median(r[k] for r in runs["this tree"]), 1) for k in runs["this tree"][0]}
    print(f"us per request (median of rounds), this tree: {medians}")
    before = {}
    if args.baseline:
        before = {
            f"baseline_{k}": round(statistics.median(r[k] for r in runs[args.baseline]), 1)
            for k in runs[args.baseline][0]
        }
        print(f"us per request (median of rounds), {args.baseline}: {before}")
    print(result_line({**medians, "rounds": len(runs["this tree"]), **before}))


if __name__ == "__main__":
    main()
