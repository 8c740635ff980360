"""Small real runs for the dashboard tests: tiny synthetic fundus sites, a few rounds.

``build(base)`` writes, under ``base`` (the session fixture ``dashboard_runs`` builds it once):

- ``runs/feddrm``: FedDRM with a dropout in round 2, killed after round 2 and resumed;
- ``runs/fedavg``: FedAvg, uninterrupted;
- ``half_written``: the FedDRM run as the kill left it (config, 2 rounds, no summary, no model);
- ``data``: the synthetic sites (JPEG/PNG files to route).

``write_summary_run(path, summary)`` writes a run directory holding only a config and a given
summary.json; ``clinical_summary()`` is one with every evaluation figure set to known values
(CIs, a site on 4 positives, operating points, calibration, cross-site, both protocols) and
``old_summary()`` one written before any of them existed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from medfed.config import TrainConfig
from medfed.data.synth import synthesize
from medfed.federation.coordinator import Coordinator
from medfed.federation.training import load_sites, train
from medfed.metrics import (
    Calibration,
    FederationMetrics,
    Interval,
    OperatingPoint,
    Pooled,
    wilson,
)
from medfed.runs import RunDir
from medfed.runs.schema import CrossSiteCell, RocPoints, RouterFigures, SiteFigures, Summary
from tests.oldruns import before_intervals

ROUNDS = 3
DROPPED_SITE = "rimone"


class Killed(Exception):
    """Stands in for the process being killed right after a checkpoint."""


@dataclass(frozen=True)
class DashboardRuns:
    base: Path
    runs: Path
    feddrm: Path
    fedavg: Path
    half_written: Path
    data: Path

    def fundus_photo(self) -> Path:
        return sorted((self.data / "ACRIMA").glob("*.jpg"))[0]


def _config(algorithm: str, **extra) -> TrainConfig:
    return TrainConfig(algorithm, rounds=ROUNDS, local_steps=2, batch_size=8, device="cpu", **extra)


@pytest.fixture(scope="session")
def dashboard_runs(tmp_path_factory) -> DashboardRuns:
    """The runs of :func:`build`, trained once per test session (read-only: copy to change)."""
    return build(tmp_path_factory.mktemp("dashboard"))


def build(base: Path) -> DashboardRuns:
    data = base / "data"
    manifests = synthesize(data, modality="fundus", n_per_site=24, seed=1, image_size=64)
    sites = load_sites(manifests, base / "cache")
    runs = base / "runs"
    feddrm = runs / "feddrm"
    config = _config("feddrm", faults=(f"2:{DROPPED_SITE}:drop",))
    original = Coordinator.checkpoint

    def die_after_round_2(self: Coordinator, round_: int, site_states=None) -> None:
        original(self, round_, site_states)
        if round_ == 2:
            raise Killed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Coordinator, "checkpoint", die_after_round_2)
        with pytest.raises(Killed):
            train(sites, config, feddrm)
    half_written = base / "half_written"
    shutil.copytree(feddrm, half_written)
    train(sites, config, feddrm, resume=True)
    train(sites, _config("fedavg"), runs / "fedavg")
    return DashboardRuns(base, runs, feddrm, runs / "fedavg", half_written, data)


# ---------------------------------------------------------------------------- crafted summaries
SITES = ("acrima", "refuge", "rimone")
UNRELIABLE_SITE = "rimone"  # 4 positives among its 30 test scans
# site: (AUC, CI low, CI high, positives, negatives, threshold, tp, fn, tn, fp)
CLINICAL = {
    "acrima": (0.84, 0.78, 0.90, 40, 80, 0.42, 34, 6, 72, 8),
    "refuge": (0.91, 0.85, 0.96, 50, 150, 0.37, 45, 5, 135, 15),
    "rimone": (0.70, 0.45, 0.92, 4, 26, 0.55, 3, 1, 20, 6),
}
POOLED = Pooled(0.82, 0.71, 0.89, 0.35, 0.05, 3.1, 3, "DerSimonian-Laird on logit AUC")
# model's site -> data's site -> (AUC or None, accuracy, n)
CROSS = {
    "acrima": {"acrima": (0.84, 0.80, 120), "refuge": (0.66, 0.61, 200), "rimone": (None, 0.7, 30)},
    "refuge": {"acrima": (0.72, 0.69, 120), "refuge": (0.91, 0.88, 200), "rimone": (0.58, 0.6, 30)},
    "rimone": {
        "acrima": (0.61, 0.55, 120),
        "refuge": (0.64, 0.62, 200),
        "rimone": (0.70, 0.77, 30),
    },
}
# protocol -> router -> (correct, routed home, abstained, answered correct, tp, pos, tn, neg)
ROUTERS = {
    "routers": {
        "density_ratio": (280, 250, 20, 270, 60, 80, 200, 250),
        "majority_vote": (270, None, 0, 270, 58, 94, 212, 256),
    },
    "routers_origin_known": {
        "density_ratio": (300, 290, 10, 295, 70, 88, 220, 252),
        "majority_vote": (272, None, 0, 272, 59, 94, 213, 256),
    },
}
N_POOLED = 350


def _site(site: str) -> SiteFigures:
    auc, low, high, pos, neg, threshold, tp, fn, tn, fp = CLINICAL[site]
    n = pos + neg
    point = OperatingPoint(
        rule="specificity:0.9",
        threshold=threshold,
        tp=tp,
        fp=fp,
        tn=tn,
        fn=fn,
        sensitivity=wilson(tp, tp + fn),
        specificity=wilson(tn, tn + fp),
        ppv=wilson(tp, tp + fp),
        npv=wilson(tn, tn + fn),
    )
    bins = [
        {"mean_predicted": 0.1, "fraction_positive": 0.05, "n": n // 3},
        {"mean_predicted": 0.5, "fraction_positive": 0.4, "n": n // 3},
        {"mean_predicted": 0.9, "fraction_positive": 0.8, "n": n - 2 * (n // 3)},
    ]
    return SiteFigures(
        auc=auc,
        auc_reason=None,
        accuracy=(tp + tn) / n,
        balanced_accuracy=(tp / (tp + fn) + tn / (tn + fp)) / 2,
        n_test=n,
        n_train=4 * n,
        n_val=n,
        roc=RocPoints(fpr=[0.0, 0.2, 1.0], tpr=[0.0, auc, 1.0], thresholds=[None, 0.5, 0.0]),
        n_pos=pos,
        n_neg=neg,
        auc_ci=Interval(auc, low, high, "DeLong"),
        unreliable=f"fewer than 10 positives ({pos})" if pos < 10 else None,
        operating_point=point,
        calibration=Calibration(
            n=n, brier=0.12, ece=0.07, intercept=-0.2, slope=0.85, reason=None, bins=bins
        ),
    )


def _router(name: str, counts: tuple) -> RouterFigures:
    correct, home, abstained, answered_correct, tp, pos, tn, neg = counts
    answered = N_POOLED - abstained
    rates = {
        "system_accuracy": wilson(correct, N_POOLED),
        "abstain_rate": wilson(abstained, N_POOLED),
        "answered_accuracy": wilson(answered_correct, answered),
        "sensitivity": wilson(tp, pos),
        "specificity": wilson(tn, neg),
    }
    if home is not None:
        rates["routing_accuracy"] = wilson(home, N_POOLED)
    return RouterFigures(
        system_accuracy=correct / N_POOLED,
        routing_accuracy=None if home is None else home / N_POOLED,
        abstain_rate=abstained / N_POOLED,
        answered_accuracy=answered_correct / answered,
        forward_passes=3,
        latency_ms_per_scan=2.5,
        n_pooled=N_POOLED,
        rates=rates,
    )


def clinical_summary(**changes) -> Summary:
    """A finished run's summary with every evaluation figure known (see the tables above)."""
    sites = {s: _site(s) for s in SITES}
    aucs = {s: f.auc for s, f in sites.items()}
    values = dict(
        sites=sites,
        federation=FederationMetrics(
            n_sites=3,
            mean_site_auc=sum(aucs.values()) / 3,
            worst_site_auc=aucs["rimone"],
            worst_site="rimone",
            best_site_auc=aucs["refuge"],
            best_site="refuge",
            auc_std=0.088,
            worst10_auc=aucs["rimone"],
            auc_gini=0.05,
            average_accuracy=0.8,
            mean_accuracy=0.79,
            accuracy_std=0.03,
            sites_without_auc=[],
            average_accuracy_by_train=0.81,
        ),
        routing_method="density_ratio",
        system_accuracy=280 / N_POOLED,
        routing_accuracy=250 / N_POOLED,
        abstain_rate=20 / N_POOLED,
        routers={n: _router(n, c) for n, c in ROUTERS["routers"].items()},
        routers_origin_known={n: _router(n, c) for n, c in ROUTERS["routers_origin_known"].items()},
        pooled_auc=POOLED,
        worst_site_auc_ci=sites["rimone"].auc_ci,
        cross_site={
            m: {
                d: CrossSiteCell(
                    auc=auc,
                    auc_reason=None if auc is not None else "test split has only class 0",
                    accuracy=accuracy,
                    n=n,
                )
                for d, (auc, accuracy, n) in row.items()
            }
            for m, row in CROSS.items()
        },
        algorithm="feddrm",
        params={},
        rounds=ROUNDS,
        local_steps=2,
        seed=0,
        backbone="cnn",
        modality="fundus",
        device="cpu",
        priors={s: 1 / 3 for s in SITES},
        bytes_per_round=1000.0,
        seconds_per_round=1.0,
        seconds_total=3.0,
        dropouts=0,
        dropped=[],
        resumes=0,
        operating_rule="specificity:0.9",
    )
    return Summary(**(values | changes))


def old_summary() -> dict:
    """summary.json as medfed wrote it before CIs and the clinical figures: the same run
    without any of their keys (nor ROC points, nor router rates)."""
    return before_intervals(clinical_summary().to_dict(), roc=False)


def write_summary_run(path: Path, summary: Summary | dict) -> Path:
    """A finished run directory holding only its config and ``summary``."""
    run = RunDir(path)
    path.mkdir(parents=True, exist_ok=True)
    run.write_config({"train": {"rounds": ROUNDS}})
    run.write_summary(summary)
    return path
