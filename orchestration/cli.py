"""The ``shotloom`` command (installed by ``pip install .``):

    shotloom serve --config configs/server.cpu.yaml      the whole service (server.py)
    shotloom generate --config ... --prompt ... --output out.mp4   one clip, no Dagster (inference.py)
    shotloom check --config <server or inference YAML>   validate it and the checkpoint folder it
                                                         names; loads no weights

``check`` exits 0 when the YAML and its checkpoint hold, 2 otherwise, naming the offending key.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

CHECK_FAILED = 2


class CheckError(Exception):
    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def _validation_errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()
    )


def check_checkpoint(folder: Path, buildable: bool) -> str:
    """A diffusers folder: ``model_index.json`` and a subfolder for each component it lists."""
    index = folder / "model_index.json"
    if not index.is_file():
        if buildable:
            return f"{folder} is missing: the tiny random checkpoint is built there at load"
        raise CheckError("paths.checkpoint", f"{folder} has no model_index.json (a diffusers folder)")
    try:
        components = json.loads(index.read_text())
    except ValueError as exc:
        raise CheckError("paths.checkpoint", f"{index} is not JSON: {exc}") from None
    missing = [
        name
        for name, value in components.items()
        if not name.startswith("_") and isinstance(value, list) and value[0] and not (folder / name).is_dir()
    ]
    if missing:
        raise CheckError("paths.checkpoint", f"{folder} lacks the component folder(s) {missing}")
    return f"{folder}: {components.get('_class_name', 'a diffusers pipeline')}"


def check_inference(path: Path) -> list[str]:
    from shotloom.config import load_inference_config

    try:
        cfg = load_inference_config(path)
    except ValidationError as exc:
        raise CheckError(str(path), _validation_errors(exc)) from None
    notes = [f"inference YAML {path}: family {cfg.family}"]
    notes.append(check_checkpoint(Path(cfg.paths.checkpoint), bool(cfg.tiny.build_if_missing)))
    for i, adapter in enumerate(cfg.adapters):
        if not Path(adapter.path).exists() and not cfg.tiny.build_if_missing:
            raise CheckError(f"adapters[{i}].path", f"{adapter.path} does not exist")
    return notes


def check_server(path: Path) -> list[str]:
    from settings.server import ServerConfig

    try:
        cfg = ServerConfig.load(path)
    except ValidationError as exc:
        raise CheckError(str(path), _validation_errors(exc)) from None
    notes = [f"server YAML {path}: {len(cfg.workers.devices)} device slot(s), state in {cfg.state_dir}"]
    inference = cfg.inference.config
    if not inference.is_file():
        raise CheckError("inference.config", f"{inference} does not exist")
    return notes + check_inference(inference)


def check(path: Path) -> list[str]:
    """Validate a server or inference YAML (told apart by their keys)."""
    from shotloom.config import rooted

    path = rooted(path, base=Path.cwd())
    if not path.is_file():
        raise CheckError("--config", f"{path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise CheckError(str(path), "not a YAML mapping")
    return check_inference(path) if "family" in data else check_server(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="shotloom", description="A video-generation service orchestrated by Dagster."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,generate,check}")
    sub.add_parser("serve", help="start the whole service from a server YAML", add_help=False)
    sub.add_parser("generate", help="one clip from an inference YAML, no Dagster", add_help=False)
    checking = sub.add_parser("check", help="validate a server or inference YAML and its checkpoint")
    checking.add_argument("--config", required=True, type=Path)
    if argv and argv[0] in ("serve", "generate"):  # their own options, parsed by their own parsers
        if argv[0] == "serve":
            from orchestration.supervisor import main as serve

            return serve(argv[1:])
        from shotloom.generate import main as generate

        return generate(argv[1:])
    args = parser.parse_args(argv)
    try:
        notes = check(args.config)
    except CheckError as exc:
        print(f"shotloom check: {exc}", file=sys.stderr)
        return CHECK_FAILED
    for note in notes:
        print(note)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
