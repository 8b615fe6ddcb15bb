"""A throwaway PostgreSQL server for the journal's tests and its benchmark: Debian's binaries
(``.ci/postgresql-from-debian.sh`` installs them; ``make test`` runs it), a cluster made in a
temporary folder, listening on 127.0.0.1 at a free port, stopped and removed at the end.

The server refuses to run as root, and CI runs as root: there every command of the cluster runs
as the ``postgres`` user the package makes (``runuser``), in a folder that user owns. The
fixtures: ``postgres_cluster``, one server for the session, and ``postgres_url``, a fresh
database of it for each test, so that what one test's runs leave is not another's listing.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

#: Where Debian's postgresql puts a major version's server binaries.
DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"

#: Seconds the server may take to start or stop.
START_SECONDS = 60


def binaries() -> str | None:
    """The folder of the newest installed major version's ``initdb`` and ``pg_ctl``."""
    found = [
        os.path.dirname(initdb) for initdb in glob.glob(os.path.join(DEBIAN_BINARIES, "initdb"))
    ]
    if not found:
        return None
    return max(found, key=lambda folder: int(folder.split("/")[-2].split(".")[0]))


def missing() -> str | None:
    """Why no server can be started here; ``None`` when one can."""
    if binaries() is None:
        return (
            "PostgreSQL is not installed (Debian's `postgresql`, which "
            ".ci/postgresql-from-debian.sh installs as root and `make test` runs)"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no `postgres` user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Cluster:
    """A running server: its folder, its port, and the superuser's name (no password: trust
    on 127.0.0.1 only)."""

    folder: str
    port: int
    user: str = "soma"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], folder: str) -> None:
    # Run in the cluster's folder: the server's user may not enter the checkout's.
    ran = subprocess.run(
        _as_server_user(command),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=START_SECONDS,
        check=False,
    )
    if ran.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` failed ({ran.returncode}):\n{ran.stdout}\n{ran.stderr}"
        )


@contextlib.contextmanager
def cluster(*, durable: bool = False) -> Iterator[Cluster]:
    """A server in a new temporary folder, stopped and removed when the block ends, however it
    ends. ``durable=False`` turns off ``fsync`` (nothing here outlives the machine; a killed
    client, what the tests kill, loses nothing either way); the benchmark keeps it on."""
    folder_of_binaries = binaries()
    if folder_of_binaries is None:
        raise RuntimeError(missing())
    folder = tempfile.mkdtemp(prefix="soma-pg-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data = os.path.join(folder, "data")
    pg_ctl = os.path.join(folder_of_binaries, "pg_ctl")
    started = False
    try:
        _run(
            [
                os.path.join(folder_of_binaries, "initdb"),
                "-D",
                data,
                "-U",
                "soma",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            folder,
        )
        settings = f"-k {folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not durable:
            settings += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        # A free port can be taken between finding it and the server binding it: try again.
        for attempt in itertools.count():
            port = _free_port()
            try:
                _run(
                    [
                        pg_ctl,
                        "-D",
                        data,
                        "-l",
                        os.path.join(folder, "log"),
                        "-w",
                        "-t",
                        str(START_SECONDS),
                        "-o",
                        f"{settings} -p {port}",
                        "start",
                    ],
                    folder,
                )
            except RuntimeError:
                if attempt == 2:
                    with contextlib.suppress(OSError), open(os.path.join(folder, "log")) as log:
                        raise RuntimeError(f"the server did not start:\n{log.read()}") from None
                    raise
                continue
            break
        started = True
        yield Cluster(folder, port)
    finally:
        if started:
            _run([pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One server for the session; the tests that use it skip, saying why, only where
    PostgreSQL is not installed."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    with cluster() as running:
        yield running


_databases = itertools.count()


@pytest.fixture
def postgres_url(postgres_cluster: Cluster) -> str:
    """A fresh database of the session's server, for one test: its ``postgresql://`` URL."""
    return postgres_cluster.create_database(f"test_{os.getpid()}_{next(_databases)}")
