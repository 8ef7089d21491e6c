#!/usr/bin/env python
"""Dagster overhead: inference.py vs the same generation as a Dagster run, side by side.

For each tiny family at two sizes it runs, as fresh processes with a cold
conditioning cache, ``inference.py`` and ``dagster job execute`` of the r2v job on
the same inference YAML, prompt and seed, and prints wall time, peak RSS and the
ratio. Target: Dagster overhead at most 15% at the larger size.

    python bench/pipeline.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, result_line, run_measured  # noqa: E402

# (family, label, width, height, frames): the "large" size takes >= ~10 s on 2 CPU cores.
CASES = [
    ("wan", "small", 64, 64, 17),
    ("wan", "large", 256, 256, 49),
    ("ltx2", "small", 64, 64, 17),
    ("ltx2", "large", 256, 256, 49),
]


def case_config(tmp: Path, family: str, width: int) -> Path:
    """The tiny YAML with a fresh (cold) conditioning cache and tiles scaled to the size."""
    base = yaml.safe_load((REPO / "configs" / f"inference.{family}-tiny.yaml").read_text())
    tile = max(32, width // 2)  # two tiles across at every size: the tiled path runs, at a sane cost
    base["tiling"].update(tile_px=tile, stride_px=tile * 3 // 4)
    base["paths"]["cache_dir"] = str(tmp / f"cache-{uuid.uuid4().hex}")
    path = tmp / f"{family}-{uuid.uuid4().hex}.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def cli_command(cfg: Path, tmp: Path, shot: dict) -> list[str]:
    return [
        sys.executable, "inference.py", "--config", str(cfg), "--prompt", shot["prompt"],
        "--seed", str(shot["seed"]), "--width", str(shot["width"]), "--height", str(shot["height"]),
        "--num-frames", str(shot["num_frames"]), "--output", str(tmp / "cli.mp4"),
    ]  # fmt: skip


def dagster_command(cfg: Path, tmp: Path, shot: dict) -> list[str]:
    run_cfg = tmp / "run.yaml"
    run_cfg.write_text(yaml.safe_dump({
        "ops": {"condition_op": {"config": {"work_id": "bench", "shot_id": "s", **shot}}},
        "resources": {
            "runtime": {"config": {"inference_config": str(cfg)}},
            "media": {"config": {"root": str(tmp / "media")}},
            "io_manager": {"config": {"base_dir": str(tmp / "steps")}},
        },
    }))  # fmt: skip
    dagster = str(Path(sys.executable).parent / "dagster")
    return [dagster, "job", "execute", "-m", "orchestration.definitions", "-j", "r2v", "-c", str(run_cfg)]


def run_case(tmp: Path, family: str, w: int, h: int, n: int, repeat: int) -> dict:
    """Best of ``repeat`` for each side, alternating so background load hits both alike."""
    shot = {"prompt": "a lighthouse in a storm", "seed": 11, "width": w, "height": h, "num_frames": n}
    env = {"DAGSTER_HOME": str(tmp / "dagster_home")}
    best = {"cli_s": float("inf"), "dagster_s": float("inf"), "cli_mib": 0.0, "dagster_mib": 0.0}
    for _ in range(repeat):
        for side, command in (("cli", cli_command), ("dagster", dagster_command)):
            wall, mib, _ = run_measured(command(case_config(tmp, family, w), tmp, shot), env=env)
            best[f"{side}_s"] = min(best[f"{side}_s"], wall)
            best[f"{side}_mib"] = max(best[f"{side}_mib"], mib)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--family", action="append", choices=["wan", "ltx2"])
    p.add_argument("--repeat", type=int, default=2, help="runs per side; the best is reported")
    args = p.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "dagster_home").mkdir()
        header = ("case", "size", "cli s", "dagster s", "ratio", "cli MiB", "dg MiB")
        print("{:<12} {:>12} {:>8} {:>10} {:>6} {:>8} {:>8}".format(*header))
        for family, label, w, h, n in CASES:
            if args.family and family not in args.family:
                continue
            r = run_case(tmp, family, w, h, n, args.repeat)
            ratio = r["dagster_s"] / r["cli_s"]
            print(
                f"{family + '-' + label:<12} {f'{w}x{h}x{n}':>12} {r['cli_s']:>8.2f} {r['dagster_s']:>10.2f} "
                f"{ratio:>6.2f} {r['cli_mib']:>8.0f} {r['dagster_mib']:>8.0f}"
            )
            key = f"{family}_{label}"
            figures[f"{key}_cli_s"] = round(r["cli_s"], 2)
            figures[f"{key}_dagster_s"] = round(r["dagster_s"], 2)
            figures[f"{key}_overhead_pct"] = round((ratio - 1) * 100, 1)
    print(result_line(figures))


if __name__ == "__main__":
    main()
