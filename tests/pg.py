"""A throwaway PostgreSQL server for tests: ``initdb`` in a temporary directory, ``pg_ctl start`` on a free
127.0.0.1 port (trust auth, fsync off: acknowledged commits survive a crash of the server, not of the
machine), one fresh schema per test, ``pg_ctl stop -m immediate`` at the end.

PostgreSQL refuses to run as root; as root the cluster is created and run as the ``postgres`` user (or
``nobody``) through ``subprocess``'s ``user=``. To use an existing server instead of starting one (a CI
service container), set ``SHOTLOOM_TEST_POSTGRES_URL`` to a URL whose role may ``CREATE SCHEMA`` in its
database, e.g. ``postgresql://postgres:pw@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import URL, make_url

ENV_URL = "SHOTLOOM_TEST_POSTGRES_URL"
_SUPERUSER = "shotloom"


def missing_reason() -> str | None:
    """Why no test server can be had here (None: one can)."""
    if os.environ.get(ENV_URL):
        return None
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            return f"PostgreSQL's {tool} is not on PATH (or set {ENV_URL} to an existing server)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    """The unprivileged user to run the server as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


@dataclass
class PostgresServer:
    """A running server; ``fresh_url()`` gives each test an empty schema of its own."""

    base_url: URL  # the maintenance database, driver postgresql+psycopg
    root: Path | None = None  # our temporary cluster directory (None: an external server)
    user: str | None = None
    start_command: list[str] = field(default_factory=list)  # pg_ctl ... start, as it was started
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    def fresh_url(self, prefix: str = "t") -> str:
        """The SQLAlchemy URL (``postgresql+psycopg://...``) of an empty schema of its own: a new schema
        first on the connection's ``search_path`` (much cheaper than CREATE DATABASE, ~0.3 s each)."""
        import psycopg

        name = f"shotloom_{prefix}_{os.getpid()}_{next(self._names)}"
        conninfo = self.base_url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{name}"')
        url = self.base_url.update_query_dict({"options": f"-c search_path={name}"})
        return url.render_as_string(hide_password=False)

    def fresh_database(self, name: str) -> str:
        """A new empty database (dropped first if left over): ``postgresql://`` URL, no driver named,
        as Dagster and operators write it."""
        import psycopg

        conninfo = self.base_url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.base_url.set(drivername="postgresql", database=name).render_as_string(hide_password=False)

    def go_away(self) -> None:
        """Stop the server as a restart or a crash does (clients cut off at once), keeping its data."""
        if self.root is None:
            raise RuntimeError("an external server cannot be stopped by the tests")
        self._stop_immediately(check=True)

    def _stop_immediately(self, check: bool) -> None:
        subprocess.run(
            ["pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "-s", "stop"],
            user=self.user,
            capture_output=True,
            timeout=30,
            check=check,
        )

    def come_back(self) -> None:
        """Start it again on the same port, with the same data."""
        proc = subprocess.run(
            self.start_command,
            user=self.user,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start again: {proc.stderr}")

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            self._stop_immediately(check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def start(also_listen: str | None = None, trusted_network: str | None = None) -> PostgresServer:
    """Start a throwaway cluster (or attach to ``$SHOTLOOM_TEST_POSTGRES_URL``). Raises with the server log
    when it does not come up. ``also_listen``: one more address to listen on (a test network's), with
    ``trusted_network`` (CIDR) let in without a password as loopback is."""
    external = os.environ.get(ENV_URL)
    if external and not also_listen:
        return PostgresServer(base_url=make_url(external).set(drivername="postgresql+psycopg"))

    user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="shotloom-pg-"))
    if user is not None:
        pw = pwd.getpwnam(user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    data = root / "data"
    try:
        initdb = ["initdb", "-D", str(data), "-U", _SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"]
        subprocess.run(
            [*initdb, "--no-sync", "--no-instructions"],
            user=user,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        if trusted_network:
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {trusted_network} trust\n")
        listen = ",".join(["127.0.0.1", *([also_listen] if also_listen else [])])
        last_error = ""
        for _ in range(3):  # a free port can be taken between probing and binding: try another
            port = _free_port()
            options = (
                f"-c listen_addresses={listen} -p {port} -k {shlex.quote(str(root))} "
                # Commits wait for their WAL write (synchronous_commit on: the default), not for
                # its fsync: go_away() stops the server as a crash does (-m immediate), and with
                # asynchronous commit the last ~0.5 s of acknowledged commits were lost with it (a
                # run's end, a stage event), which no production server with default settings does.
                "-c fsync=off -c full_page_writes=off -c max_connections=200"
            )
            log = root / f"server-{port}.log"
            pg_ctl = ["pg_ctl", "-D", str(data), "-w", "-s"]
            start_command = [*pg_ctl, "-l", str(log), "-o", options, "-t", "30", "start"]
            proc = subprocess.run(
                start_command,
                user=user,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if proc.returncode == 0:
                url = URL.create(
                    "postgresql+psycopg", _SUPERUSER, host="127.0.0.1", port=port, database="postgres"
                )
                return PostgresServer(base_url=url, root=root, user=user, start_command=start_command)
            last_error = proc.stderr + (log.read_text(errors="replace") if log.exists() else "")
            # A start that timed out may have left a postmaster behind: stop it before retrying.
            subprocess.run(
                [*pg_ctl, "-m", "immediate", "stop"], user=user, env=env, capture_output=True, timeout=30
            )
        raise RuntimeError(f"PostgreSQL did not start:\n{last_error}")
    except subprocess.CalledProcessError as e:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed:\n{e.stdout}\n{e.stderr}") from e
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
