"""The statistics-only run on a real loopback federation (a SuperLink and two SuperNodes, as
processes): one site's policy forbids its data card and refuses by that rule, the other
releases its statistics; statistics.json is written and both audit logs show the message."""

from __future__ import annotations

import json
import time

import pytest

from medfed.flower.deploy import write_statistics_app
from medfed.flower.loopback import LoopbackFederation
from medfed.governance.records import read_audit
from medfed.governance.statistics import StatisticsSettings
from medfed.runs.statistics import read_statistics, statistics_path

# Real SuperLink and SuperNode processes: needs medfed[flower]; make test-fast leaves them out.
pytestmark = [pytest.mark.flower, pytest.mark.slow]

SITES = ["acrima", "rimone"]


def test_a_deployed_statistics_run_releases_or_refuses_by_policy(tiny_sites, tmp_path) -> None:
    manifests, cache = tiny_sites
    app, run_dir = tmp_path / "app", tmp_path / "stats_run"
    settings = StatisticsSettings(min_count=3, noise="laplace", epsilon=1.0)
    write_statistics_app(app, settings, SITES, str(run_dir), wait_s=120, reply_timeout_s=240)
    policy = tmp_path / "acrima.policy.toml"
    policy.write_text("[outputs]\ndata_card = false\n", encoding="utf-8")
    fed = LoopbackFederation(tmp_path, task_poll_s=0.1)
    try:
        fed.start_superlink()
        for site in SITES:
            fed.start_supernode(
                site, manifests[site], cache=cache, state_dir=tmp_path / f"state_{site}",
                policy=policy if site == "acrima" else None,
            )  # fmt: skip
        fed.submit(app)
        deadline = time.monotonic() + 300
        while not statistics_path(run_dir).exists() and time.monotonic() < deadline:
            time.sleep(1)
        logs = "\n".join(f"--- {n}\n{fed.log(n)[-3000:]}" for n in fed.procs)
    finally:
        fed.close()

    stats = read_statistics(run_dir)
    assert stats is not None, logs
    assert stats.sites["acrima"].status == "refused"
    assert stats.sites["acrima"].refusals[0]["rule"] == "outputs.data_card"
    rimone = stats.sites["rimone"]
    assert rimone.status == "released", f"{rimone.reason}\n{logs}"
    assert rimone.noise is not None
    assert rimone.noise.mechanism == "laplace" and rimone.noise.epsilon == 1.0
    assert all(v is None or v >= 0 for per in rimone.counts.values() for v in per.values())
    assert not (run_dir / "summary.json").exists()  # nothing trained
    for site, decision in (("acrima", "refused"), ("rimone", "unchecked")):
        audit = read_audit(tmp_path / f"state_{site}")
        assert [(r["direction"], r["kind"], r["decision"]) for r in audit] == [
            ("received", "query.statistics", decision),
            ("sent", "query.statistics", decision),
        ], json.dumps(audit)
