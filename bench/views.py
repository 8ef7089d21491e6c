#!/usr/bin/env python
"""The pollers' cached answer alone, in-process: CPU per cached ``GET /version`` body.

A SQLite store with ``--jobs`` queued shots, two running ones whose progress a second store (as the
API's tracker, or another API process) writes every ``--write-ms``, and a job leaving the queue
every second; on an asyncio loop, ``--per-turn`` bodies each turn of the loop (as uvicorn answers
pollers), for ``--seconds``. Prints the event-loop thread's CPU per body, with and without the
writer, and ends with one ``RESULT`` line.

What it leaves out is what every request pays besides (uvicorn, the fast path's middleware, the
response): ``bench/api.py`` measures the whole. To compare another revision, run the same file with
that revision's tree first on the import path (e.g. a ``git worktree`` and ``PYTHONPATH``).

    python bench/views.py [--jobs 64] [--per-turn 50] [--write-ms 20] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

# The tree measured is the one first on the import path (this checkout, or another on PYTHONPATH):
# this checkout and the script's own folder go last (there bench/api.py cannot stand for the api
# package).
_BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH] + [str(_BENCH.parent), str(_BENCH)]

from _common import result_line  # noqa: E402

from api.r2v.views import version_views  # noqa: E402
from api.store import NewJob, Store, payload_hash  # noqa: E402
from settings.api import ApiConfig  # noqa: E402


def shot(i: int) -> NewJob:
    request = {"work_id": "w", "shot_id": f"s{i}", "prompt": "a kite", "memory_slots": []}
    return NewJob(kind="r2v", work_id="w", shot_id=f"s{i}", job_id=None, request=request,
                  payload_hash=payload_hash(request))  # fmt: skip


def measure(store: Store, writer: Store | None, ids: list[str], args: argparse.Namespace) -> float:
    """Microseconds of event-loop CPU per cached body, with ``writer`` writing meanwhile (or not)."""
    views = version_views(store, "http://api", 10_000)
    stop = threading.Event()

    def track() -> None:  # progress of the running jobs; now and then one leaves the queue
        n, leaving = 0, 2
        while not stop.is_set():
            n += 1
            for version in ids[:2]:
                writer.update_status(
                    version, live={"progress": {"stage": "denoise", "done": n, "total": 10**6}}
                )
            if n % max(1, int(1000 / args.write_ms)) == 0 and leaving < len(ids):
                writer.update_status(ids[leaving], status="running", stage="claimed")
                leaving += 1
            time.sleep(args.write_ms / 1000)

    if writer is not None:
        threading.Thread(target=track, daemon=True).start()
    rng = random.Random(0)

    async def poll() -> float:
        busy, bodies = 0.0, 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            start = time.thread_time()
            for _ in range(args.per_turn):
                views.get(ids[rng.randrange(len(ids))])
            busy += time.thread_time() - start
            bodies += args.per_turn
            await asyncio.sleep(0)
        return busy / bodies * 1e6

    try:
        return asyncio.run(poll())
    finally:
        stop.set()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=64)
    p.add_argument("--per-turn", type=int, default=50)
    p.add_argument("--write-ms", type=float, default=20)
    p.add_argument("--seconds", type=float, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        url = ApiConfig().resolved_database_url(Path(root) / "state")
        store, writer = Store(url), Store(url)
        try:
            ids = [store.accept(shot(i)).version_id for i in range(args.jobs)]
            for version in ids[:2]:
                writer.update_status(version, status="running", stage="inferring")
            quiet = measure(store, None, ids, args)
            written = measure(store, writer, ids, args)
        finally:
            store.close()
            writer.close()
    print(f"cached GET /version body, event-loop CPU: {quiet:.2f} us (nothing written), "
          f"{written:.2f} us (a write every {args.write_ms:g} ms), {args.per_turn} a turn")  # fmt: skip
    print(result_line({"body_us": round(quiet, 2), "body_us_written": round(written, 2),
                       "per_turn": args.per_turn, "write_ms": args.write_ms}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
