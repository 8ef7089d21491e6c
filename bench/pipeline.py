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


def case_config(tmp: Path, family: str, label: str, kind: str, width: int) -> Path:
    base = yaml.safe_load((REPO / "configs" / f"inference.{family}-tiny.yaml").read_text())
    tile = max(32, width // 2)  # two tiles across at every size: the tiled path runs, at a sane cost
    base["tiling"].update(tile_px=tile, stride_px=tile * 3 // 4)
    base["paths"]["cache_dir"] = str(tmp / f"cache-{family}-{label}-{kind}")  # cold cache for each
    path = tmp / f"{family}-{label}-{kind}.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def run_case(tmp: Path, family: str, label: str, w: int, h: int, n: int) -> dict:
    prompt, seed = "a lighthouse in a storm", 11
    cli_cfg = case_config(tmp, family, label, "cli", w)
    cli = [
        sys.executable,
        "inference.py",
        "--config",
        str(cli_cfg),
        "--prompt",
        prompt,
        "--seed",
        str(seed),
        "--width",
        str(w),
        "--height",
        str(h),
        "--num-frames",
        str(n),
        "--output",
        str(tmp / "cli.mp4"),
    ]
    cli_s, cli_mib, _ = run_measured(cli)

    dg_cfg = case_config(tmp, family, label, "dagster", w)
    run_cfg = tmp / "run.yaml"
    run_cfg.write_text(
        yaml.safe_dump(
            {
                "ops": {
                    "condition_op": {
                        "config": {
                            "work_id": "bench",
                            "shot_id": f"{family}-{label}",
                            "prompt": prompt,
                            "seed": seed,
                            "width": w,
                            "height": h,
                            "num_frames": n,
                        }
                    }
                },
                "resources": {
                    "runtime": {"config": {"inference_config": str(dg_cfg)}},
                    "media": {"config": {"root": str(tmp / "media")}},
                    "io_manager": {"config": {"base_dir": str(tmp / "steps")}},
                },
            }
        )
    )
    dagster = [
        str(Path(sys.executable).parent / "dagster"),
        "job",
        "execute",
        "-m",
        "orchestration.definitions",
        "-j",
        "r2v",
        "-c",
        str(run_cfg),
    ]
    dg_s, dg_mib, _ = run_measured(dagster, env={"DAGSTER_HOME": str(tmp / "dagster_home")})
    return {"cli_s": cli_s, "cli_mib": cli_mib, "dagster_s": dg_s, "dagster_mib": dg_mib}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--family", action="append", choices=["wan", "ltx2"])
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
            r = run_case(tmp, family, label, w, h, n)
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
