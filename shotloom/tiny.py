"""Build tiny, randomly initialised checkpoints in the real diffusers folder format.

    python -m shotloom.tiny                      # every family into checkpoints/<family>-tiny
    python -m shotloom.tiny --family wan --out /tmp/wan-tiny --seed 3

The inference YAMLs with ``tiny.build_if_missing`` also build them on first use.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shotloom.config import REPO_ROOT
from shotloom.families import FAMILIES, adapter_class


def build(family: str, out: Path, seed: int = 0) -> Path:
    return adapter_class(family).build_tiny_checkpoint(out, seed=seed)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), action="append")
    p.add_argument("--out", type=Path, help="output folder (only with a single --family)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    families = args.family or sorted(FAMILIES)
    if args.out and len(families) != 1:
        p.error("--out needs exactly one --family")
    for family in families:
        out = args.out or REPO_ROOT / "checkpoints" / f"{family}-tiny"
        print(f"{family}: {build(family, out, args.seed)}")


if __name__ == "__main__":
    main()
