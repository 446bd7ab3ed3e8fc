"""A set of independent training runs as tasks on a Ray cluster: ``make family`` with ``RAY_ADDRESS``
set, or ``python -m attncircuits.train.family --ray [ADDRESS]``.

Each run (a family member) is one Ray task that asks for one CPU, or one GPU when the members train
on CUDA, and calls the same function the local pool calls: it writes its results, its saved state
and its line in the folder's manifest exactly as a local run does, so the folder must be one every
node sees (a shared filesystem; ``--out`` names it), and the package the same version on every node
(each task checks both before it trains, and says which in one line). A task whose worker dies (a
node lost, a process killed) is started again by Ray, :data:`RETRIES` times, and resumes from the
member's last saved state; a member that fails is reported in one line once the others end, and
the same command trains what is left. Without an address nothing here runs: the members train in
this machine's process pool.

Ray is an optional dependency (``pip install 'attncircuits[ray]'``); an address given without it,
or a cluster that cannot be reached, is refused in one line before anything is written.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Callable, Iterable, Iterator

import torch

#: the environment variable Ray itself reads for the cluster's address
ENV = "RAY_ADDRESS"
#: times Ray starts a member's task again after its worker died (each resumes the saved state)
RETRIES = 3
#: seconds to wait for the cluster's address to answer before refusing it
CONNECT_TIMEOUT_S = 5.0
_LEAVE_OUT = f"or leave out --ray and unset {ENV} to train on this machine"


def address_from(flag: str | None, environ=os.environ) -> str | None:
    """The cluster to use: ``--ray ADDRESS``; ``--ray`` alone (``flag == ""``): :data:`ENV`, else a
    Ray instance started on this machine (``"local"``); no flag: :data:`ENV` or None (no Ray)."""
    env = environ.get(ENV, "").strip() or None
    if flag is None:
        return env
    return flag.strip() or env or "local"


def _host_port(address: str) -> tuple[str, int] | None:
    """The host and port of ``host:port`` or ``ray://host:port`` (None: ``auto``, ``local``)."""
    if address in ("auto", "local"):
        return None
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SystemExit(f"Ray address {address!r} is not host:port, ray://host:port, auto or local; "
                         f"give the cluster's address, {_LEAVE_OUT}")
    return host.strip("[]"), int(port)


class Cluster:
    """A connection to a Ray cluster that runs one task per training run."""

    def __init__(self, ray, address: str):
        self.ray, self.address = ray, address

    def gpus(self) -> float:
        return float(self.ray.cluster_resources().get("GPU", 0))

    def device(self, device: str | None) -> torch.device:
        """Where the tasks train: ``device`` (cpu or cuda; cuda needs GPUs in the cluster), else
        CUDA when the cluster has GPUs, else the CPU."""
        try:
            dev = torch.device(device or ("cuda" if self.gpus() else "cpu"))
        except (RuntimeError, ValueError):
            raise SystemExit(f"--device {device!r} is not a device; use cpu or cuda on a Ray cluster") from None
        if dev.type not in ("cpu", "cuda"):
            raise SystemExit(f"--device {device}: a Ray task trains on cpu or cuda")
        if dev.type == "cuda" and not self.gpus():
            raise SystemExit(f"--device {device}: the Ray cluster at {self.address} has no GPU; use --device cpu "
                             "or add GPU nodes")
        return dev

    def run(self, fn: Callable, jobs: Iterable[tuple], names: list[str], gpu: bool) -> Iterator:
        """``fn(job)`` for each job as a task (one CPU, or one GPU), yielding each return value as it
        ends; a task that failed for good is said in one line each once every task has ended, and
        the command then exits (status 2)."""
        ray = self.ray
        task = ray.remote(fn)
        refs = {task.options(num_cpus=1, num_gpus=1 if gpu else 0, max_retries=RETRIES, retry_exceptions=False,
                             name=f"train {name}").remote(job): name
                for name, job in zip(names, jobs)}
        failed = []
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                name = refs.pop(ref)
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as err:
                    cause = getattr(err, "cause", None)
                    why = str(cause) if cause is not None else str(err).strip().splitlines()[0]
                    failed.append((name, why.splitlines()[0] if why else type(err).__name__))
        for name, why in failed:
            print(f"error: {name} failed on the Ray cluster ({why}); the members that finished are kept, and the "
                  "same command trains what is left", file=sys.stderr)
        if failed:
            sys.exit(2)

    def close(self) -> None:
        self.ray.shutdown()


def connect(address: str, num_cpus: int | None = None) -> Cluster:
    """Connect to the Ray cluster at ``address`` (``local``: start one on this machine, with
    ``num_cpus`` CPUs); a missing Ray or an address that does not answer within
    :data:`CONNECT_TIMEOUT_S` is refused in one line (SystemExit) before anything else happens."""
    try:
        import ray
    except ImportError:
        raise SystemExit(f"Ray is not installed: pip install 'attncircuits[ray]' to run on a cluster, "
                         f"{_LEAVE_OUT}") from None
    hp = _host_port(address)
    if hp is not None:
        try:
            socket.create_connection(hp, timeout=CONNECT_TIMEOUT_S).close()
        except OSError as err:
            why = err.strerror or type(err).__name__
            raise SystemExit(f"the Ray cluster at {address} cannot be reached ({why}); start it (`ray start "
                             f"--head` on its head node) and give that node's address, {_LEAVE_OUT}") from None
    kwargs = {"num_cpus": num_cpus} if address == "local" else {}
    try:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=True, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SystemExit(f"the Ray cluster at {address} cannot be used ({line}); check that a Ray head node "
                         f"listens there, {_LEAVE_OUT}") from None
    return Cluster(ray, address)
