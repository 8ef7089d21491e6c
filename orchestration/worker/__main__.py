"""Long-lived worker: one process per device, model loaded once, runs executed in-process.

    python -m orchestration.worker --device cpu:0 --threads 1 --state-dir var/server
    python -m orchestration.worker --pool media --name media-0 --state-dir var/server

The command line: what must happen before torch is imported (the device, thread counts,
niceness), then the Worker (``orchestration.worker.process``) serves until stopped.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from orchestration.worker.process import Worker
from shotloom.parallel import GroupSpec, ParallelConfig


def pin_device(device: str, threads: int) -> str:
    """Set what torch reads at import time; returns the canonical device string."""
    kind, _, index = device.partition(":")
    if kind.isdigit():  # a bare CUDA logical id
        kind, index = "cuda", kind
    if kind == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = index or "0"
    elif kind == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU worker must never grab a GPU
    else:
        raise ValueError(f"unknown device {device!r} (cpu[:n], cuda:<id> or <id>)")
    if threads > 0:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(threads)
    return f"{kind}:{index or 0}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=("device", "media"), default="device", help="which runs it takes")
    parser.add_argument("--device", default="cpu:0", help="cpu[:n], cuda:<logical id> or <id>")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--nice", type=int, default=0, help="add this to the process's niceness")
    parser.add_argument("--name", default="", help="registry name (default: from the device)")
    parser.add_argument("--state-dir", default=os.environ.get("SHOTLOOM_STATE_DIR", "var/server"))
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless a token is set)")
    parser.add_argument("--advertise", default="", help="host others reach it by (default: --host)")
    parser.add_argument("--port", type=int, default=0, help="status port (0 = any free port)")
    parser.add_argument("--no-warm", dest="warm", action="store_false", help="load weights on first run")
    parser.add_argument("--server-config", default="", help="server YAML (its runtime section)")
    parser.add_argument(
        "--group-ids", default="", help="a device group: its devices, e.g. 0,1 (rank 0 first)"
    )
    parser.add_argument("--parallel", default="", help='a group\'s split, JSON: {"ulysses": 2}')
    args = parser.parse_args(argv)

    device = pin_device(args.device, args.threads)  # before anything imports torch
    group = None
    if args.group_ids:
        kind = device.partition(":")[0]
        if kind == "cuda":  # every rank sees the group's devices; rank r uses logical id r
            os.environ["CUDA_VISIBLE_DEVICES"] = args.group_ids
        device = f"{kind}:0"
        group = GroupSpec(
            parallel=ParallelConfig.model_validate_json(args.parallel or "{}"),
            device_type=kind,
            threads=args.threads,
        )
    if args.nice > 0:
        os.nice(args.nice)  # torch's threads, started later, inherit it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads > 0 and args.pool == "device":  # media workers never load torch
        import torch

        torch.set_num_threads(args.threads)
    name = args.name or device.replace(":", "-")
    from settings.server import RuntimeConfig, ServerConfig

    server = ServerConfig.load(args.server_config) if args.server_config else None
    runtime_cfg = server.runtime if server else RuntimeConfig()
    api_url = server.api.local_url() if server else None
    worker = Worker(
        name, device, args.threads, Path(args.state_dir), args.warm, runtime_cfg, args.pool, api_url, group
    )
    worker.serve(args.host, args.port, args.advertise or None)


if __name__ == "__main__":
    main()
