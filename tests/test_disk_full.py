"""A full disk under the media root: a small tmpfs the test mounts there (root only; skipped with the
reason elsewhere). A shot accepted while there was room fails when its MP4 cannot be written, with
the path and the room left in its error, and nothing half-written is kept or served; meanwhile new
work is refused with 507 in both dialects and /health says which disk; once space is freed, the
service takes work again by itself."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from api_stack import start_api_stack, stop_api_stack, wait_for

MIN_FREE_MB = 2


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    path = tmp_path_factory.mktemp("small-disk")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk``."""
    filler = disk / "filler.bin"
    block = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    for size in (4096, 512, 1):  # the last pages a 64 KiB block did not fit in
        with open(filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


@pytest.fixture(scope="module")
def stack(tmp_path_factory, wan_checkpoint, small_disk):
    root = tmp_path_factory.mktemp("disk-full")
    s = start_api_stack(
        root, wan_checkpoint, in_process=True, media_root=str(small_disk), api={"min_free_mb": MIN_FREE_MB}
    )
    yield s
    stop_api_stack(s)


def shot(n: int) -> dict:
    return {"work_id": "disk", "shot_id": f"s{n}", "prompt": f"shot {n}", "memory_slots": [], "seed": n}


def test_a_full_media_disk_fails_the_write_cleanly_refuses_new_work_and_recovers(stack, small_disk):
    accepted = stack.post("/r2v", shot(1))
    assert accepted.status_code == 202, accepted.text
    version = accepted.json()["version_id"]
    filler = fill(small_disk)  # the disk fills up while the shot is generated

    failed = stack.wait_version(version)
    assert failed["status"] == "failed", failed
    assert "no space left to write" in failed["error"] and "output.mp4" in failed["error"], failed["error"]
    # Nothing half-written kept, indexed or served.
    assert failed.get("video_url") is None and not failed.get("artifacts"), failed
    leftovers = [p for p in small_disk.rglob("*") if p.is_file() and p != filler]
    assert not [p for p in leftovers if p.suffix in (".mp4", ".part") or p.name.endswith(".part")], leftovers

    # The service says why and refuses new work in both dialects, before queueing anything.
    health = stack.get("/health")
    assert health.status_code == 503 and health.json()["ready"]["disk"] is False, health.text
    media = next(d for d in health.json()["disk"] if d["name"] == "media_root")
    assert media["ok"] is False and media["free_bytes"] < MIN_FREE_MB << 20
    refused = stack.post("/r2v", shot(2))
    assert refused.status_code == 507, refused.text
    assert "media_root" in refused.json()["error"] and "min_free_mb" in refused.json()["error"]
    v1 = stack.client.post(stack.base + "/v1/videos", json={"prompt": "a kite"})
    assert v1.status_code == 507 and v1.json()["error"]["code"] == "insufficient_storage", v1.text
    counts = stack.get("/health").json()["queues"]["r2v"]
    assert (counts["queued"], counts["running"], counts["failed"]) == (0, 0, 1)

    # Space is back: the service goes on by itself.
    os.unlink(filler)
    wait_for(lambda: stack.get("/health").status_code == 200, 30, "/health ok again")
    again = stack.post("/r2v", shot(2))
    assert again.status_code == 202, again.text
    done = stack.wait_version(again.json()["version_id"])
    assert done["status"] == "succeeded", done

    import av

    path = next(small_disk.rglob("output.mp4"))
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == done["result"]["frames"] > 0
