#!/usr/bin/env python
"""Pack what a GPU machine lacks for ``bench/gpu_check.sh`` into ``.gpu/site.tar.xz``.

The lent GPU machines run their own image (``bench/gpu_image.yaml``: Python 3.12, a CUDA build of
torch, no internet). This packs the rest of the service, at exactly the versions installed in this
virtual environment (the ones the tests ran with), as an installed ``site-packages`` for that
Python and platform: every pure-Python package, and the compiled ones the image lacks (PyAV,
pydantic-core, SQLAlchemy...). The image's torch stack is never packed, nor its compiled packages.
``gpu_check.sh`` unpacks it there and puts it first on ``PYTHONPATH``.

    .venv/bin/python bench/gpu_carry.py [--image bench/gpu_image.yaml] [--python 3.12] [--out .gpu]

Needs the package index (run it here, not there). ``--python`` packs for another interpreter, so
the same packing can be rehearsed on this machine (``--python 3.11``, then ``gpu_check.py --cpu``).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata as md
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parent.parent
TRAVEL_LIMIT_MIB = 64  # what one device call carries, working tree included
TEST_NEEDS = ("pytest", "httpx")  # tests/test_cuda.py and its conftest


def wanted(python: str) -> list[str]:
    """The runtime closure of pyproject's dependencies (and the CUDA tests' needs) as installed
    here, evaluated for the target Python: ``name==version`` lines."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    test_pins = [r for r in project["optional-dependencies"]["test"] if Requirement(r).name in TEST_NEEDS]
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    seen: dict[str, str] = {}
    todo = [Requirement(r) for r in project["dependencies"] + test_pins]  # no markers at the top
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        dist = md.distribution(req.name)
        seen[name] = dist.version
        envs = [{**env, "extra": extra} for extra in ("", *req.extras)]
        for dep in map(Requirement, dist.requires or []):
            if dep.marker is None or any(dep.marker.evaluate(e) for e in envs):
                todo.append(dep)
    return [f"{n}=={v}" for n, v in sorted(seen.items())]


def matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, canonicalize_name(p)) for p in patterns)


def is_pure(wheel: Path) -> bool:
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return all(t.abi == "none" and t.platform == "any" for t in tags)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", type=Path, default=REPO / "bench" / "gpu_image.yaml")
    p.add_argument("--python", help="target interpreter version (default: the image's)")
    p.add_argument("--out", type=Path, default=REPO / ".gpu")
    args = p.parse_args()
    image = yaml.safe_load(args.image.read_text())
    python = args.python or str(image["python"])
    skip = image["torch_stack"] + image["not_needed"]
    present = {canonicalize_name(n) for n in image["present"]}
    pins = [pin for pin in wanted(python) if not matches(pin.split("==")[0], skip)]
    target = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]
    for platform in image["platforms"]:
        target += ["--platform", platform]

    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        pip("download", "--no-deps", *target, "-d", str(wheels), *pins)
        carried, left = [], []
        for wheel in sorted(wheels.iterdir()):
            name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
            (left if name in present and not is_pure(wheel) else carried).append(wheel)
        pip("install", "--no-deps", "--no-compile", *target, "--target", str(site), *map(str, carried))
        # Nothing there runs these: console scripts (their shebangs name this machine's Python),
        # the web UI's source maps.
        shutil.rmtree(site / "bin", ignore_errors=True)
        for junk in [*site.rglob("*.map"), *site.rglob("__pycache__")]:
            shutil.rmtree(junk) if junk.is_dir() else junk.unlink()
        args.out.mkdir(parents=True, exist_ok=True)
        archive = args.out / "site.tar.xz"
        with tarfile.open(archive, "w:xz", preset=9) as tar:
            tar.add(site, arcname=".")
    manifest = [f"# for Python {python}; packed from {sys.prefix}", "# carried:"]
    manifest += [f"  {w.name}" for w in carried] + ["# left to the machine (compiled, present there):"]
    manifest += [f"  {w.name}" for w in left]
    (args.out / "manifest.txt").write_text("\n".join(manifest) + "\n")
    (args.out / "python-version").write_text(python + "\n")
    size = archive.stat().st_size / 2**20
    print(f"{archive}: {size:.1f} MiB, {len(carried)} packages carried, {len(left)} left to the machine")
    if size > TRAVEL_LIMIT_MIB - 8:
        print(f"warning: over {TRAVEL_LIMIT_MIB - 8} MiB; with the working tree it may not travel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
