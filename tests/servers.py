"""Throwaway servers for the tests: PostgreSQL from the machine's binaries and Redis, each on a free
loopback port in a temporary directory, stopped at the end (also when a test failed).

A test that needs a server it cannot get is SKIPPED with a loud reason (never silently passed);
with the environment variable CI set it FAILS instead, so CI cannot go green without them.
"""

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def unavailable(reason: str) -> None:
    """Skip loudly, or fail under CI."""
    message = f"!!! SERVER NOT AVAILABLE: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else (Path(shutil.which("initdb")).parent if shutil.which("initdb") else None)


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the `postgres` user then."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A running throwaway cluster: `url(db)` for a database, `new_database()` for an empty one."""

    def __init__(self, bin_dir: Path, root: Path, port: int):
        self.bin_dir, self.root, self.port = bin_dir, root, port
        self.data = root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(_as_postgres([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args]),
                              capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        proc = self.pg_ctl("-l", str(self.root / "log"), "-w", "-o",
                           f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on", "start")
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {proc.stderr or proc.stdout}")

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop -m `mode`: fast (sessions terminated, a clean shutdown) or immediate (as a crash)."""
        self.pg_ctl("-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        proc = self.pg_ctl("-l", str(self.root / "log"), "-m", mode, "-w", "restart", "-o",
                           f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed: {proc.stderr or proc.stdout}")

    def new_database(self) -> str:
        """An empty database of its own (one per test): its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """initdb into a temporary directory (owned by `postgres` when we are root), start on a free
    loopback port, yield, stop and remove — also when the body raised."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        unavailable("PostgreSQL binaries not found (/usr/lib/postgresql/*/bin); install postgresql")
    root = Path(tempfile.mkdtemp(prefix="pg-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        init = subprocess.run(_as_postgres([str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", "postgres",
                                            "-A", "trust", "--no-sync"]),
                              capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            unavailable(f"initdb failed: {(init.stderr or init.stdout).strip()[:300]}")
        server = Postgres(bin_dir, root, free_port())
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def redis_server() -> Iterator[str]:
    """redis-server on a free loopback port, no persistence; yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        unavailable("redis-server not found; install Debian's redis-server (make test does it as root)")
    root = Path(tempfile.mkdtemp(prefix="redis-"))
    port = free_port()
    proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(root), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
