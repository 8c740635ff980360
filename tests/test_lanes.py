"""Lanes: how many sites of a round train at once, and how the cores are divided."""

from __future__ import annotations

import threading

import pytest
import torch

from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.federation.lanes import Lanes
from medfed.models.device import resolve_device

CPU = resolve_device("cpu")


@pytest.mark.parametrize(
    ("requested", "sites", "cores", "workers", "threads"),
    [
        (0, 3, 2, 3, 1),  # auto: every site at once, a core shared when sites outnumber cores
        (0, 2, 16, 2, 8),  # auto: the cores divided between the sites
        (0, 12, 2, 4, 1),  # auto: at most twice the cores
        (0, 3, 1, 1, 1),  # auto on one core: one by one
        (0, 1, 8, 1, 8),  # one site keeps every core
        (1, 3, 8, 1, 8),  # one by one, as before lanes existed
        (2, 3, 8, 2, 4),
        (5, 3, 8, 3, 2),  # never more lanes than sites
    ],
)
def test_plan_divides_the_cores_between_the_sites(requested, sites, cores, workers, threads):
    lanes = Lanes.plan(requested, sites, CPU, cores=cores)
    assert (lanes.workers, lanes.threads, lanes.cuda) == (workers, threads, None)
    assert lanes.concurrent == (workers > 1)
    assert ("at a time, each on" in lanes.describe()) == lanes.concurrent


def test_auto_trains_volumes_one_by_one_unless_asked() -> None:
    assert Lanes.plan(0, 2, CPU, cores=2, volumes=True) == Lanes(1, 2)
    assert Lanes.plan(2, 2, CPU, cores=2, volumes=True) == Lanes(2, 1)


def test_map_keeps_the_order_and_runs_each_lane_on_its_own_threads() -> None:
    lanes = Lanes(workers=3, threads=1)
    seen: dict[int, tuple[str, int]] = {}
    barrier = threading.Barrier(3, timeout=30)  # all three must be running at once

    def work(k: int) -> int:
        barrier.wait()
        seen[k] = (threading.current_thread().name, torch.get_num_threads())
        return k * k

    before = torch.get_num_threads()
    assert lanes.map(work, [3, 1, 2]) == [9, 1, 4]
    assert {threads for _, threads in seen.values()} == {1}
    assert all(name.startswith("medfed-site") for name, _ in seen.values())
    assert torch.get_num_threads() == before  # the caller's threads are its own


def test_map_raises_the_first_failure_after_every_site_has_finished() -> None:
    lanes = Lanes(workers=2, threads=1)
    finished = []

    def work(k: int) -> int:
        if k == 1:
            raise ValueError("site 1 failed")
        finished.append(k)
        return k

    with pytest.raises(ValueError, match="site 1 failed"):
        lanes.map(work, [0, 1, 2, 3])
    assert sorted(finished) == [0, 2, 3]


def test_one_lane_runs_in_the_calling_thread() -> None:
    assert (
        Lanes(workers=1, threads=4).map(lambda _: threading.current_thread(), [0, 1])
        == [threading.current_thread()] * 2
    )


@pytest.mark.parametrize("value", [-1, 257])
def test_a_concurrency_out_of_range_is_refused_by_name(value) -> None:
    with pytest.raises(ConfigError, match=r"concurrency \(--concurrency\)"):
        TrainConfig(algorithm="fedavg", concurrency=value)


def test_freed_memory_is_kept_once_per_process_unless_the_user_chose(monkeypatch) -> None:
    from medfed.models.device import keep_freed_memory

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    keep_freed_memory.cache_clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert keep_freed_memory() is False  # the user's setting is left alone
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    assert keep_freed_memory() is False  # decided once per process
    keep_freed_memory.cache_clear()
    assert keep_freed_memory() is True  # glibc here: both settings taken
