"""Server YAML: what ``server.py --config`` reads (``orchestration.instance_yaml`` makes Dagster's
``dagster.yaml`` from it).

Relative paths resolve against the repository root, like the inference YAML's.
No torch here: server.py, the webserver and the daemon import this.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from settings.api import ApiConfig
from shotloom.config import REPO_ROOT, Adapter, rooted
from shotloom.parallel import ParallelConfig

SERVICE_SCHEMA = "shotloom"  # the service store's PostgreSQL schema (Dagster's tables stay in public)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebserverConfig(_Strict):
    host: str = "127.0.0.1"  # loopback: the API in front of it is the public face
    port: int = Field(default=3000, ge=1, le=65535)


class InferenceRef(_Strict):
    config: Path = Field(description="Inference YAML; it selects the checkpoint.")
    adapters: list[Adapter] | None = Field(
        default=None,
        description="LoRA adapters every worker loads beside the base weights (name, path, scale); "
        "replaces the inference YAML's own list. None: the inference YAML's.",
    )


class DeviceConfig(_Strict):
    device: str = Field(
        description="'cpu' (or 'cpu:n'), 'cuda:<logical id>' or a bare logical id; a group: 'cpu' or 'cuda'."
    )
    threads: int = Field(default=0, ge=0, description="torch CPU threads (0 = torch's default); per rank.")
    nice: int | None = Field(
        default=None, ge=0, le=19, description="CPU scheduling niceness (default: workers.cpu_nice / 0)."
    )
    ids: list[int] | None = Field(
        default=None,
        min_length=2,
        description="A device group: these devices (CUDA logical ids; on CPU, one rank each) run one "
        "job together, one slot in the queue. Needs parallel.",
    )
    parallel: ParallelConfig | None = Field(
        default=None, description="How a group splits each denoise: {ulysses: N} (ring: CUDA only)."
    )

    @field_validator("device", mode="before")
    @classmethod
    def _as_str(cls, v: Any) -> str:
        return str(v)

    @model_validator(mode="after")
    def _group(self) -> DeviceConfig:
        if (self.ids is None) != (self.parallel is None):
            raise ValueError("a device group needs both ids and parallel")
        if self.ids is not None and self.parallel is not None:
            if len(set(self.ids)) != len(self.ids):
                raise ValueError(f"ids: repeated device in {self.ids}")
            if len(self.ids) != self.parallel.degree:
                raise ValueError(
                    f"parallel: ulysses x ring = {self.parallel.degree} ranks, "
                    f"but ids names {len(self.ids)} devices"
                )
            if self.device not in ("cpu", "cuda"):
                raise ValueError(
                    f"device: a group's is 'cpu' or 'cuda' (its ids say which), got {self.device!r}"
                )
        return self

    @property
    def is_cpu(self) -> bool:
        return self.device.partition(":")[0] == "cpu"

    @property
    def is_group(self) -> bool:
        return self.ids is not None


class WorkersConfig(_Strict):
    warm: bool = Field(default=True, description="Load the model before taking the first run.")
    devices: list[DeviceConfig] = Field(
        default_factory=list, description="This host's device workers (a control-only host lists none)."
    )
    media: int = Field(
        default=2,
        ge=0,
        description="Media workers (CPU, no model, no torch): merges, each shot's stills, stitching and "
        "frames taken from videos run there, never behind a generation; two, so a merge or a "
        "request's frames seldom wait behind a shot's stills.",
    )
    name_prefix: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="Prepended to this host's worker names (gpu1-cuda-0): names are unique across hosts.",
    )
    bind: str = Field(
        default="127.0.0.1",
        description="Address the workers' endpoints listen on. Anything but loopback needs the control "
        "plane's token in SHOTLOOM_WORKER_TOKEN (the workers refuse to start without it).",
    )
    advertise: str | None = Field(
        default=None, description="Host the control plane reaches the workers by (default: bind)."
    )
    cpu_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Niceness of CPU device workers: their compute yields the CPU to the API, webserver "
        "and daemon, which stay responsive on a saturated host (CUDA workers default to 0).",
    )

    media_nice: int = Field(
        default=5,
        ge=0,
        le=19,
        description="Niceness of media workers: between the API (0) and CPU device workers (cpu_nice): "
        "a still or a merge yields to the API's answers, not to a generation.",
    )

    def niceness(self, device: DeviceConfig) -> int:
        if device.nice is not None:
            return device.nice
        return self.cpu_nice if device.is_cpu else 0


class StorageConfig(_Strict):
    """Where Dagster's runs, events and schedules and the service store live."""

    postgres_url_env: str | None = Field(
        default=None,
        description="Name of an env var holding a PostgreSQL URL (postgresql://user:pw@host:port/db): "
        "Dagster's storage and the service store (schema 'shotloom') on it, shared by every host. "
        "The URL is read from the environment, never written to a file. Unset: SQLite under state_dir.",
    )


class MonitoringConfig(_Strict):
    poll_interval_seconds: int = 5
    max_resume_run_attempts: int = 2  # a run interrupted by a worker's death resumes on another
    start_timeout_seconds: int = 600  # includes waiting for a worker that is still warming
    cancel_timeout_seconds: int = 60


class RuntimeConfig(_Strict):
    """How device workers place weights and admit work (the r2v spec's weight lifecycle)."""

    dit_residency: Literal["auto", "resident", "swap"] = Field(
        default="auto",
        description="auto: resident when free VRAM holds the measured peak plus a reserve, else swap "
        "(group offload). Overrides the inference YAML's offload flag.",
    )
    gpu_headroom_fraction: float = Field(default=0.05, ge=0, lt=1)
    ram_headroom_fraction: float = Field(default=0.10, ge=0, lt=1)
    idle_seconds: float = Field(
        default=0, ge=0, description="Release weights after this idle time; 0 = never."
    )
    admission_poll_seconds: float = Field(
        default=1.0, gt=0, description="Re-check of a waiting job's memory."
    )
    orphan_scan_seconds: float = Field(
        default=5.0, gt=0, description="How often an idle worker looks for runs nobody will start."
    )
    handover_grace_seconds: float = Field(
        default=15.0,
        gt=0,
        description="A STARTING run not handed to a worker after this is taken by an idle worker.",
    )
    heartbeat_seconds: float = Field(
        default=2.0, gt=0, description="How often a worker refreshes its record in the shared registry."
    )
    heartbeat_timeout_seconds: float = Field(
        default=15.0,
        gt=0,
        description="A worker silent this long is dead: its runs are resumed or retried elsewhere.",
    )
    storage_outage_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long a worker waits for Dagster's storage when it cannot take writes "
        "(PostgreSQL restarting or failing over, SQLite's disk full) before failing what it was doing: a "
        "run in flight waits at its next write and goes on, its outcome recorded once the storage takes "
        "it.",
    )


class RetriesConfig(_Strict):
    """Dagster run retries: a run that failed as a whole (e.g. its worker kept dying past the resume
    attempts) is re-executed from failure under a new run id; the API follows it (dagster/root_run_id).
    A step that fails on its own (bad input, out of memory twice) is not retried."""

    max_retries: int = Field(default=1, ge=0)


class SupervisionConfig(_Strict):
    restart_limit: int = Field(default=5, ge=1, description="Restarts of one child within the window...")
    restart_window_seconds: float = Field(default=60, gt=0, description="...before the service stops.")


class RerenderSchedule(_Strict):
    """A scheduled re-render: new versions of the matching shots on a cron, below interactive work."""

    name: str = Field(pattern=r"^[A-Za-z0-9_]+$", description="The schedule's name (and the runs' reason).")
    cron: str = Field(description='Cron schedule, e.g. "0 3 * * *" (nightly at 03:00).')
    timezone: str = "UTC"
    works: list[str] | None = Field(default=None, description="Works to re-render (default: all).")
    shots: list[str] | None = Field(default=None, description="Shot ids (default: every shot).")
    match: dict[Literal["shotloom/kind", "user"], str] | None = Field(
        default=None, description='Only shots whose runs carry these tags, e.g. {"shotloom/kind": "v1"}.'
    )
    seed: Literal["keep", "new"] = "keep"
    priority: int = Field(default=-10, ge=-1000, le=1000)


def offered_rerenders() -> list[RerenderSchedule]:
    """The re-render schedules every code location defines (stopped unless the YAML lists them)."""
    return [
        RerenderSchedule(name="rerender_nightly", cron="0 3 * * *"),
        RerenderSchedule(name="rerender_weekly", cron="0 4 * * 0"),
    ]


class ServerConfig(_Strict):
    state_dir: Path = Field(default=Path("var/server"), description="Instance home, logs, step storage.")
    webserver: WebserverConfig = WebserverConfig()
    inference: InferenceRef
    workers: WorkersConfig
    storage: StorageConfig = StorageConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    supervision: SupervisionConfig = SupervisionConfig()
    retries: RetriesConfig = RetriesConfig()
    api: ApiConfig = ApiConfig()
    dequeue_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        description="The daemon dequeues as soon as a run is queued or finishes (it looks every "
        "50 ms); besides, at this interval, for what that look does not see (a worker come alive).",
    )
    media_root: Path | None = Field(default=None, description="Default: <state_dir>/media.")
    step_storage: Path | None = Field(default=None, description="Default: <state_dir>/steps.")
    workspace: Path | None = Field(
        default=None,
        description="A Dagster workspace YAML for the daemon and webserver; default: the code location "
        "module orchestration.definitions, wherever the packages are installed.",
    )
    rerender: list[RerenderSchedule] = Field(
        default_factory=list,
        description="Scheduled re-renders (Dagster schedules in the code location), running from the start.",
    )
    rerender_offered: list[RerenderSchedule] = Field(
        default_factory=offered_rerenders,
        description="Re-render schedules defined stopped: an operator switches one on in the Dagster UI "
        "(Automation). One with the name of a `rerender` entry is that entry (running).",
    )
    rerender_on_checkpoint_change: bool = Field(
        default=False,
        description="A sensor re-renders every shot whose newest version was made with another checkpoint. "
        "False: the sensor is defined stopped (the UI's Automation page switches it on).",
    )
    rerender_priority: int = Field(default=-10, ge=-1000, le=1000, description="Of the sensor's re-renders.")
    rerender_sensor_interval_s: int = Field(
        default=60, ge=1, description="How often the checkpoint sensor looks for stale shots."
    )

    @classmethod
    def load(cls, path: str | Path) -> ServerConfig:
        cfg = cls.model_validate(yaml.safe_load(cls.located(path).read_text()) or {})
        return cfg.resolved()

    @staticmethod
    def located(path: str | Path) -> Path:
        """The server YAML a command line names (relative: to the working directory, or shipped)."""
        return rooted(path, base=Path.cwd())

    def resolved(self) -> ServerConfig:
        state = rooted(self.state_dir)
        return self.model_copy(
            update={
                "state_dir": state,
                "inference": InferenceRef(
                    config=rooted(self.inference.config),
                    adapters=[a.model_copy(update={"path": rooted(a.path)}) for a in self.inference.adapters]
                    if self.inference.adapters is not None
                    else None,
                ),
                "media_root": rooted(self.media_root) if self.media_root else state / "media",
                "step_storage": rooted(self.step_storage) if self.step_storage else state / "steps",
                "workspace": rooted(self.workspace) if self.workspace else None,
                "api": self.api.model_copy(
                    update={
                        "inputs": self.api.inputs.resolved(REPO_ROOT),
                        "auth": self.api.auth.resolved(REPO_ROOT),
                    }
                ),
            }
        )

    def inference_config(self) -> Path:
        """The inference YAML every process loads: the named one, or (when this server YAML lists
        adapters) a copy with them under the state dir, written atomically and only on change."""
        base = self.inference.config
        if self.inference.adapters is None:
            return base
        data = yaml.safe_load(base.read_text()) or {}
        data["adapters"] = [a.model_dump(mode="json") for a in self.inference.adapters]
        text = f"# {base} with the adapters of the server YAML (written by the server; do not edit)\n"
        text += yaml.safe_dump(data, sort_keys=False)
        out = self.state_dir / "inference.yaml"
        if not out.is_file() or out.read_text() != text:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(out)
        return out

    @property
    def dagster_home(self) -> Path:
        return self.state_dir / "dagster_home"

    def worker_slots(self) -> list[tuple[str, str]]:
        """(name, device) per device worker. Names are stable (the registry key across restarts):
        <name_prefix>cpu-0, cpu-1, ..., cuda-<id>; the prefix keeps them unique across hosts."""
        slots, cpus = [], 0
        prefix = self.workers.name_prefix
        for d in self.workers.devices:
            if d.is_group:  # cpu-g0-1 / cuda-0-1: the group's devices, rank 0 first
                ids = "-".join(map(str, d.ids or ()))
                slots.append((f"{prefix}{d.device}-{'g' if d.is_cpu else ''}{ids}", f"{d.device}:{d.ids[0]}"))
            elif d.is_cpu:
                slots.append((f"{prefix}cpu-{cpus}", f"cpu:{cpus}"))
                cpus += 1
            else:
                kind, _, index = d.device.partition(":")
                index = index if kind == "cuda" else kind
                slots.append((f"{prefix}cuda-{index}", f"cuda:{index}"))
        return slots

    def worker_names(self) -> list[str]:
        return [name for name, _ in self.worker_slots()]

    def service_store_url(self) -> str:
        """The service store's SQLAlchemy URL: api.database_url, else the shared PostgreSQL (schema
        'shotloom', beside Dagster's tables), else SQLite under the state dir."""
        env = self.storage.postgres_url_env
        if self.api.database_url or not env:
            return self.api.resolved_database_url(self.state_dir)
        if not os.environ.get(env):
            raise ValueError(f"storage.postgres_url_env: the environment variable {env} is not set")
        from sqlalchemy.engine import make_url

        url = make_url(os.environ[env]).set(drivername="postgresql+psycopg")
        url = url.update_query_dict({"options": f"-c search_path={SERVICE_SCHEMA}"})
        return url.render_as_string(hide_password=False)

    def inputs_dir(self) -> Path:
        """Where the API stores accepted inputs, which the workers read: under the state dir on one
        host; on the shared media path when hosts share storage (a worker elsewhere reads them)."""
        if self.storage.postgres_url_env:
            return Path(self.media_root) / "inputs"
        return self.api.assets_dir(self.state_dir)

    def media_worker_names(self) -> list[str]:
        return [f"{self.workers.name_prefix}media-{n}" for n in range(self.workers.media)]
