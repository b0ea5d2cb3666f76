"""A throwaway PostgreSQL cluster (tests and ``lamina bench --stores``): Unix socket only.

``initdb`` runs as the ``postgres`` user when we are root (the server refuses root), with
its files in a temp folder, ``listen_addresses=''``, ``fsync=off``; the cluster is
stopped and removed on exit. ``Unavailable`` says why none can be started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

# Debian keeps the server binaries out of PATH, one folder per major version.
PG_BINS = Path("/usr/lib/postgresql")


class Unavailable(Exception):
    """PostgreSQL (or psycopg) is not installed here, or the cluster did not start."""


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(PG_BINS.glob(f"*/bin/{name}"), key=lambda p: p.parts[-3].zfill(4))
    return str(versions[-1]) if versions else None


def _as_owner(argv: Sequence[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else list(argv)


@attrs.frozen
class Cluster:
    """A running cluster: the folder holding its socket, and its superuser."""

    folder: Path
    user: str

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@/{database}?host={self.folder}"

    def create_database(self, name: str) -> str:
        """A fresh empty database's URL."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 STRATEGY FILE_COPY")
        return self.url(name)


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise Unavailable("PostgreSQL is not installed (no initdb): apt-get install -y postgresql")
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        raise Unavailable("psycopg is not installed: pip install -e '.[test]'") from None
    owner = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="lamina-pg-"))
    data = folder / "data"
    if owner:
        shutil.chown(folder, owner, owner)
    user = owner or os.environ.get("USER", "postgres")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    try:
        done = subprocess.run(
            _as_owner([initdb, "-D", str(data), "-U", user, "-A", "trust", "-E", "UTF8",
                       "--locale", "C.UTF-8", "--no-sync"], owner),
            check=False, **quiet,
        )  # fmt: skip
        if done.returncode != 0:
            raise Unavailable(f"initdb failed: {done.stderr.strip()}")
        options = f"-c listen_addresses='' -k {folder} -c fsync=off -c full_page_writes=off"
        started = subprocess.run(
            _as_owner([pg_ctl, "-D", str(data), "-o", options, "-l", str(folder / "log"),
                       "-w", "start"], owner),
            check=False, **quiet,
        )  # fmt: skip
        if started.returncode != 0:
            log = folder / "log"
            raise Unavailable(
                f"pg_ctl start failed: {started.stderr.strip()} "
                f"{log.read_text(errors='replace') if log.exists() else ''}"
            )
        yield Cluster(folder, user)
    finally:
        if data.exists():
            subprocess.run(
                _as_owner([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], owner),
                check=False, **quiet,
            )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
