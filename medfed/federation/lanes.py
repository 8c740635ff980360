"""Sites of a round trained side by side in one process (``--concurrency``).

On CPU each lane is a thread with its own share of the cores: PyTorch's intra-op thread count
is set per thread, so two lanes of one thread each keep two cores busy with one site apiece
instead of splitting every small operation of one site between two threads (what that gains
depends on how well the model's operations scale across threads; ``medfed bench`` measures it
against the plain loop). On CUDA each lane issues its work on its own stream.

A site's work never depends on another's: every random draw is seeded by (seed, round, site),
each site trains on its own copy of the model, and the results are collected in site order. So
a run trained with N lanes equals the one-by-one run with the same threads per site, bit for
bit (per-op thread counts can change a float reduction's order, hence "the same threads").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch

from medfed.models.device import DeviceSetup

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Lanes:
    """How many sites train at once (``workers``) and with how many intra-op threads each."""

    workers: int
    threads: int
    cuda: torch.device | None = None  # the GPU whose streams the lanes use

    @classmethod
    def plan(
        cls,
        requested: int,
        n_sites: int,
        setup: DeviceSetup,
        cores: int | None = None,
        *,
        volumes: bool = False,
    ) -> Lanes:
        """The lanes for ``requested`` (0: auto) over ``n_sites`` on ``setup``.

        ``cores`` defaults to PyTorch's thread count in this thread (what one site would use
        alone, and what OMP_NUM_THREADS or ``torch.set_num_threads`` set). Auto trains every
        site of the round at once on a CPU of two or more cores, up to twice the cores (more
        lanes than cores keep the cores busy when sites finish at different times), for 2-D
        scans; one by one for volumes (``volumes``: CT), which gained nothing side by side on
        2 cores and peaked higher (FedDRM, 8 local steps: 7-10 s a round and 3.3 GB, against
        8 s and 2.3 GB), and on CUDA, where streams only pay when one site leaves the GPU idle
        (not measured yet).
        """
        cores = max(1, cores if cores is not None else torch.get_num_threads())
        if setup.is_cuda:
            workers = 1 if requested == 0 else requested
        elif requested == 0:
            workers = 1 if cores < 2 or volumes else 2 * cores
        else:
            workers = requested
        workers = max(1, min(workers, n_sites))
        threads = cores if workers == 1 else max(1, cores // workers)
        return cls(workers, threads, torch.device(setup.device) if setup.is_cuda else None)

    @property
    def concurrent(self) -> bool:
        return self.workers > 1

    def describe(self) -> str:
        if not self.concurrent:
            return "one site at a time"
        each = "its own CUDA stream" if self.cuda is not None else f"{self.threads} thread(s)"
        return f"{self.workers} sites at a time, each on {each}"

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``fn`` over ``items``, ``workers`` at a time; results (and the first exception,
        once every item has finished) in the order of ``items``."""
        if not self.concurrent or len(items) < 2:
            return [fn(item) for item in items]
        local = threading.local()  # each lane thread's CUDA stream

        def run(item: T) -> R:
            with self._lane(local):
                return fn(item)

        with ThreadPoolExecutor(min(self.workers, len(items)), "medfed-site") as pool:
            futures = [pool.submit(run, item) for item in items]
            return [future.result() for future in futures]

    @contextmanager
    def _lane(self, local: threading.local) -> Iterator[None]:
        if self.cuda is None:
            torch.set_num_threads(self.threads)  # this thread's share of the cores
            yield
            return
        stream = getattr(local, "stream", None)
        if stream is None:
            stream = local.stream = torch.cuda.Stream(self.cuda)
        # The lane's stream first waits for what the default stream has queued (the weights and
        # tensors it reads; memory the caching allocator hands this stream again), and the
        # caller's default stream sees the lane's results once it has finished.
        stream.wait_stream(torch.cuda.default_stream(self.cuda))
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            stream.synchronize()
