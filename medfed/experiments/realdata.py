"""The pilot-study table on real photographs (``medfed real-study``).

Real sites (their manifests, e.g. ``sites/real/*.toml``) are decoded and passed through the
frozen ImageNet encoder once; every method then trains on the cached features over several
seeds (the split is the manifests'; the seeds change the training), beside a centralized run
on the pooled training scans as the upper reference. Each run's own-site answers and its
federation's answers are collected per test scan, and the figures (per-site macro AUC, the
worst multi-class site, ODIR's glaucoma AUC, system and routing accuracy) get intervals from a
two-level bootstrap over seeds and patients (:mod:`medfed.metrics.seeds`), with paired verdicts
against FedDRM under Holm's adjustment. The study also measures how photos from a source no
site has seen are flagged: each source left out in turn, and a photo from scikit-image.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.algorithms import recorded_params
from medfed.config import TrainConfig
from medfed.core.errors import ConfigError
from medfed.core.fileio import fresh_folder
from medfed.core.progress import lines_instead
from medfed.data.overview import overview_dir, write_site_overview
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.federation.training import frozen_features, load_sites, train
from medfed.metrics.seeds import SiteScans
from medfed.routing.bundle import TrainedFederation

CENTRAL = "centralized"
REFERENCE = "feddrm"
# name -> (algorithm, parameters): medfed's FedDRM (private norms) and the paper's (shared)
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "feddrm": ("feddrm", {}),
    "feddrm-paper": ("feddrm", {"private_norms": False, "client": "trained"}),
    "fedavgft": ("fedavgft", {}),
    "fedbn": ("fedbn", {}),
    "fedrep": ("fedrep", {}),
    "ditto": ("ditto", {}),
    "local": ("local", {}),
    "lora": ("lora", {"warmup_rounds": 10}),
}


@dataclass(frozen=True)
class StudyPlan:
    """What the study trains: the sites, the start, the budget and the seeds."""

    manifests: tuple[Path, ...]
    init: str = "torchvision:mobilenet_v2"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    rounds: int = 40
    local_steps: int = 10
    batch_size: int = 32
    lr: float = 0.002
    methods: tuple[str, ...] = (*METHODS, CENTRAL)
    n_boot: int = 1000

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS and m != CENTRAL]
        if unknown:
            raise ConfigError(
                f"real-study: unknown method(s) {unknown}; choose from {[*METHODS, CENTRAL]}"
            )
        if REFERENCE not in self.methods:
            raise ConfigError(f"real-study: the methods must include {REFERENCE} (the reference)")
        if len(self.seeds) < 2:
            raise ConfigError("real-study: give at least 2 seeds (the intervals resample them)")

    def config(self, method: str, seed: int) -> TrainConfig:
        algorithm, params = METHODS.get(method, ("local", {}))
        return TrainConfig(
            algorithm=algorithm,
            params=dict(params),
            rounds=self.rounds,
            local_steps=self.local_steps,
            batch_size=self.batch_size,
            lr=self.lr,
            seed=seed,
            init=self.init,
            frozen_encoder=True,
        )


@dataclass
class StudyRuns:
    """Every method's test scans by seed, its wall time, and its runs' routing calibration."""

    scans: dict[str, dict[int, dict[str, SiteScans]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    routing_ece: dict[str, list[float]] = field(default_factory=dict)
    sites: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    n_test: dict[str, int] = field(default_factory=dict)
    encode_seconds: float = 0.0


def load_encoded(plan: StudyPlan, cache: Path) -> tuple[list[SiteData], list[SiteData], float]:
    """The sites as decoded photos, and as the frozen encoder's features (cached)."""
    sites = load_sites(list(plan.manifests), cache, progress=True)
    start = time.perf_counter()
    encoded = frozen_features(sites, plan.config(REFERENCE, plan.seeds[0]), cache)
    return sites, encoded, time.perf_counter() - start


def run_study(plan: StudyPlan, out: Path, cache: Path, *, reuse: bool = False) -> StudyRuns:
    """Train every method on every seed into ``out/runs`` and collect their test scans.
    ``reuse``: read a run that finished there under the same settings instead of training it."""
    sites, encoded, seconds = load_encoded(plan, cache)
    runs = StudyRuns(
        sites=[s.id for s in encoded],
        classes=list(encoded[0].manifest.class_names().values()),
        n_test={s.id: s.n(Split.TEST) for s in encoded},
        encode_seconds=seconds,
    )
    overview: Path | None = None
    for method in plan.methods:
        runs.scans[method], runs.routing_ece[method] = {}, []
        runs.seconds[method] = 0.0
        for seed in plan.seeds:
            folder = out / "runs" / method / f"seed{seed}"
            if not (reuse and _finished(folder, plan.config(method, seed))):
                start = time.perf_counter()
                _train_one(plan, method, seed, fresh_folder(folder), encoded, cache)
                _write_seconds(folder, time.perf_counter() - start)
            runs.seconds[method] += _read_seconds(folder)
            if method == CENTRAL:
                runs.scans[method][seed] = centralized_scans(folder, encoded)
                continue
            overview = _site_overview(folder, sites, overview)
            runs.scans[method][seed] = collect_scans(folder, encoded)
            ece = (
                json.loads((folder / "summary.json").read_text()).get("routing_calibration") or {}
            ).get("ece")
            if ece is not None:
                runs.routing_ece[method].append(float(ece))
    return runs


SECONDS = "study_seconds.json"  # a study run's wall time, kept for a re-rendered study


def _write_seconds(folder: Path, seconds: float) -> None:
    (folder / SECONDS).write_text(json.dumps({"seconds": seconds}) + "\n", encoding="utf-8")


def _read_seconds(folder: Path) -> float:
    return float(json.loads((folder / SECONDS).read_text(encoding="utf-8"))["seconds"])


def _finished(folder: Path, config: TrainConfig) -> bool:
    """A run in ``folder`` finished (its wall time recorded) under the settings ``config``."""
    if not (folder / SECONDS).is_file() or not (folder / "summary.json").is_file():
        return False
    try:
        stored = tomllib.loads((folder / "config.toml").read_text(encoding="utf-8"))["train"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return False
    wanted = config.to_dict()
    keys = ("algorithm", "rounds", "local_steps", "batch_size", "lr", "seed", "init")
    params = recorded_params(config.algorithm, config.params, config.frozen_encoder)
    resolved = json.loads(json.dumps(params))
    return all(stored.get(k) == wanted.get(k) for k in (*keys, "frozen_encoder")) and (
        (stored.get("params") or {}) == resolved
    )


def _train_one(
    plan: StudyPlan,
    method: str,
    seed: int,
    folder: Path,
    encoded: Sequence[SiteData],
    cache: Path,
) -> None:
    config = plan.config(method, seed)
    if method == CENTRAL:
        config = dataclasses.replace(config, algorithm="local", params={})
        train([pooled_site(encoded)], config, folder, cache_dir=cache, say=lines_instead())
        return
    train(list(encoded), config, folder, cache_dir=cache, say=lines_instead())


def _site_overview(folder: Path, sites: Sequence[SiteData], first: Path | None) -> Path:
    """The run's Sites page data: the same for every run of the study, computed once from the
    photos and copied into each run."""
    target = overview_dir(folder)
    if first is None:
        write_site_overview(folder, list(sites))
        return target
    shutil.copytree(first, target, dirs_exist_ok=True)
    return first


# ---------------------------------------------------------------------------- collecting
def own_probs(fed: TrainedFederation, sites: Sequence[SiteData]) -> dict[str, np.ndarray]:
    """Each site's own model on its own test scans (features), class probabilities."""
    out = {}
    for site in sites:
        index = fed.position(site.id)
        probs, _ = fed.site_outputs(index, site.x[Split.TEST][:])
        out[site.id] = probs
    return out


def collect_scans(folder: Path, sites: Sequence[SiteData]) -> dict[str, SiteScans]:
    """A finished run's test scans: its own-site probabilities and predictions.csv's answers."""
    fed = TrainedFederation.load(folder, device="cpu")
    probs = own_probs(fed, sites)
    rows: dict[str, list[dict[str, str]]] = {}
    with open(folder / "predictions.csv", newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(row["site"], []).append(row)
    ids = [s.id for s in fed.sites]
    routes = fed.routes
    out = {}
    for site in sites:
        got = rows.get(site.id, [])
        y = site.y[Split.TEST].numpy()
        if [int(r["label"]) for r in got] != y.tolist():
            raise ConfigError(
                f"{folder}: predictions.csv does not match site {site.id}'s test scans"
            )
        abstained = np.array([r["abstained"] == "true" for r in got], dtype=bool)
        system = np.array([int(r["system_prediction"]) for r in got])
        out[site.id] = SiteScans(
            y=y,
            patients=np.array([r.patient_id for r in site.records[Split.TEST]]),
            probs=probs[site.id],
            system=np.where(abstained, -1, system),
            known=np.array([int(r["system_prediction_origin_known"]) for r in got]),
            # a majority vote sends the scan to no site: no routing to measure
            routed=np.array([ids.index(r["routed_site"]) if routes else -1 for r in got]),
            index=ids.index(site.id),
        )
    return out


def pooled_site(sites: Sequence[SiteData]) -> SiteData:
    """Every site's scans in one site (the centralized reference trains on it)."""
    first = sites[0]
    manifest = dataclasses.replace(first.manifest, id="pooled")
    return dataclasses.replace(
        first,
        manifest=manifest,
        raw={s: torch.cat([site.raw[s] for site in sites]) for s in Split},
        y={s: torch.cat([site.y[s] for site in sites]) for s in Split},
        records={s: [r for site in sites for r in site.records[s]] for s in Split},
    )


def centralized_scans(folder: Path, encoded: Sequence[SiteData]) -> dict[str, SiteScans]:
    """The centralized run's one model answering every site's test scans."""
    fed = TrainedFederation.load(folder, device="cpu")
    out = {}
    for index, site in enumerate(encoded):
        probs, _ = fed.site_outputs(0, site.x[Split.TEST][:])
        answer = probs.argmax(axis=1)
        out[site.id] = SiteScans(
            y=site.y[Split.TEST].numpy(),
            patients=np.array([r.patient_id for r in site.records[Split.TEST]]),
            probs=probs,
            system=answer,
            known=answer,
            routed=np.full(answer.size, -1),  # one model: nothing is routed
            index=index,
        )
    return out
