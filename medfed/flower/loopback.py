"""A Flower federation on one machine (loopback): one SuperLink, SuperNodes (with their resident
workers), ``flwr run``; for tests and for ``medfed bench-deploy``.

Every process starts in its own session on free ports, with Flower's telemetry off; each logs to
``ROOT/<name>.log``. :meth:`LoopbackFederation.close` kills each one, and every process below it,
by PID. Loopback only: without a PKI the SuperLink and SuperNodes run ``--insecure``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""Seconds between a SuperExec's looks for a task to start (Flower 1.42: 1 s unless set)."""


class LoopbackFederation:
    """``task_poll_s``: set every SuperExec's task poll (``TASK_POLL_ENV``); None: Flower's."""

    def __init__(
        self, root: Path, *, pki: Path | None = None, task_poll_s: float | None = None
    ) -> None:
        self.root, self.pki = root, pki
        self.port = free_port()
        self.home = root / "flwr_home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = os.environ | {
            "FLWR_HOME": str(self.home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if task_poll_s is not None:
            self.env[TASK_POLL_ENV] = f"{task_poll_s:g}"
        security = (
            f'root-certificates = "{pki / "ca.crt"}"\n' if pki is not None else "insecure = true\n"
        )
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "pilot"\n\n[superlink.pilot]\n'
            f'address = "127.0.0.1:{self.port}"\n{security}',
            encoding="utf-8",
        )
        self.procs: dict[str, subprocess.Popen] = {}
        # The workers' sockets: in a short private folder, since a Unix socket's path is
        # limited to about 100 bytes, which a deep ROOT would exceed.
        self.sockets = Path(tempfile.mkdtemp(prefix="medfed-workers-"))

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = (self.root / f"{name}.log").open("w")
        proc = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_superlink(self, *, auth: bool = False) -> None:
        """Start (or, after :meth:`kill`, restart) the SuperLink on this federation's port.

        Its state lives in a database file, so a restarted SuperLink still knows its nodes.
        """
        argv = [str(BIN / "flower-superlink"), "--port", str(self.port)]
        argv += ["--database", str(self.root / "superlink.db")]
        argv += ["--disable-runtime-dependency-installation"]
        if self.pki is None:
            argv.append("--insecure")
        else:
            argv += [
                "--ssl-ca-certfile",
                str(self.pki / "ca.crt"),
                "--ssl-certfile",
                str(self.pki / "server.crt"),
                "--ssl-keyfile",
                str(self.pki / "server.key"),
            ]
        if auth:
            argv.append("--enable-supernode-auth")
        self._start("superlink", argv)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the SuperLink did not listen:\n{self.log('superlink')}")

    def start_supernode(
        self,
        site: str,
        manifest: Path,
        *,
        cache: Path,
        key: Path | None = None,
        retries: int | None = 3,
        worker: Path | None = None,
        policy: Path | None = None,
        state_dir: Path | None = None,
    ) -> subprocess.Popen:
        """``policy``: the site's policy file (medfed.governance); ``state_dir``: its own state
        folder (default: one shared by every node, ROOT/node_state)."""
        state = state_dir if state_dir is not None else self.root / "node_state"
        config = f'manifest="{manifest}" state-dir="{state}" cache-dir="{cache}"'
        if worker is not None:
            config += f' worker="{worker}"'
        if policy is not None:
            config += f' policy="{policy}"'
        argv = [str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}"]
        argv += ["--port", str(free_port()), "--node-config", config]
        if retries is not None:  # None: keep trying, as a hospital's node would
            argv += ["--max-retries", str(retries)]
        if self.pki is None:
            argv.append("--insecure")
        else:
            argv += ["--root-certificates", str(self.pki / "ca.crt")]
        if key is not None:
            argv += ["--auth-supernode-private-key", str(key)]
        return self._start(f"node_{site}", argv)

    def start_worker(self, site: str) -> Path:
        """A site's resident worker (medfed deploy worker); its socket, once it serves."""
        socket_path = self.sockets / f"{site}.sock"
        self._start(f"worker_{site}", [str(BIN / "medfed"), "deploy", "worker", str(socket_path)])
        deadline = time.monotonic() + 120
        while not socket_path.exists():
            if time.monotonic() > deadline or self.procs[f"worker_{site}"].poll() is not None:
                raise RuntimeError(
                    f"the worker of {site} did not start:\n{self.log(f'worker_{site}')}"
                )
            time.sleep(0.2)
        return socket_path

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )

    def submit(self, app: Path) -> None:
        done = self.flwr("run", str(app), "pilot")
        if done.returncode != 0:
            raise RuntimeError(f"flwr run failed:\n{done.stdout}\n{done.stderr}")

    def wait_for_summary(self, run_dir: Path, timeout: float = 600) -> dict:
        summary = run_dir / "summary.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if summary.exists():
                return json.loads(summary.read_text())
            if self.procs["superlink"].poll() is not None:
                break
            time.sleep(1)
        logs = "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs)
        events = (
            (run_dir / "events.jsonl").read_text() if (run_dir / "events.jsonl").exists() else ""
        )
        raise AssertionError(f"the run did not finish within {timeout} s\n{events}\n{logs}")

    def kill(self, name: str) -> None:
        """Kill one process and everything it started, by PID.

        A SuperNode's SuperExec outlives a SuperNode that exits on its own (it is re-parented),
        so it is also found by the ``--parent-pid`` it was started with.
        """
        import psutil

        proc = self.procs.pop(name)
        family = {proc.pid}
        for other in psutil.process_iter(["pid", "cmdline"]):
            cmdline = other.info["cmdline"] or []
            if "--parent-pid" in cmdline and str(proc.pid) in cmdline:
                family.add(other.pid)
        for pid in list(family):
            with contextlib.suppress(psutil.NoSuchProcess):
                family.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        shutil.rmtree(self.sockets, ignore_errors=True)
