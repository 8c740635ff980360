"""Abstention: whether a scan fits any site, fitted one way, in one place.

Each site fits the Gaussian of its own model's features on its training split
(:func:`site_gaussian`, run where the scans are); the threshold is then set on the sites'
validation scans (:func:`calibrate`). The in-process engine and the Flower apps both go through
these two steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from medfed.core.errors import DataError
from medfed.models.device import DeviceSetup
from medfed.models.fedmodel import FedModel
from medfed.models.forward import run_model

State = dict[str, torch.Tensor]
DEFAULT_FALSE_ABSTAIN = 0.05  # share of validation scans that abstain at the threshold


@dataclass
class Abstention:
    """Out-of-distribution check: Mahalanobis distance of a scan's features to each site.

    Each site keeps the mean and (shrunk) precision of its own model's features on its training
    split; a scan's score is its distance to the closest site. Scores above ``threshold``
    (calibrated on the sites' validation splits) abstain.
    """

    means: list[torch.Tensor]
    precisions: list[torch.Tensor]
    threshold: float
    target_false_abstain: float
    val_abstain_rate: float

    def scores(self, features: list[torch.Tensor]) -> np.ndarray:
        """(n,) distance to the closest site; ``features[i]`` is site model i's view."""
        if len(features) != len(self.means):
            raise ValueError(f"{len(features)} feature sets for {len(self.means)} sites")
        return self.closest_of(dict(enumerate(features)))

    def closest_of(self, features: dict[int, torch.Tensor]) -> np.ndarray:
        """(n,) distance to the closest of the sites in ``features`` (site index: its model's
        features of the scans): the one-pass router measures only the models it ran."""
        per_site = [self.distance(i, f) for i, f in features.items()]
        return np.stack(per_site, axis=1).min(axis=1)

    def distance(self, site: int, features: torch.Tensor) -> np.ndarray:
        """(n,) Mahalanobis distance of site ``site``'s model features to that site."""
        d = features.double() - self.means[site].double()
        squared = ((d @ self.precisions[site].double()) * d).sum(dim=1)
        return squared.clamp_min(0).sqrt().cpu().numpy()  # rounding can dip just below 0

    def state(self) -> State:
        out: State = {}
        for i, (m, p) in enumerate(zip(self.means, self.precisions, strict=True)):
            out[f"mean.{i}"], out[f"precision.{i}"] = m.cpu(), p.cpu()
        return out

    def info(self) -> dict[str, float]:
        return {
            "threshold": self.threshold,
            "target_false_abstain": self.target_false_abstain,
            "val_abstain_rate": self.val_abstain_rate,
        }

    @classmethod
    def load(cls, state: State, info: dict[str, float], n_sites: int) -> Abstention:
        return cls(
            means=[state[f"mean.{i}"] for i in range(n_sites)],
            precisions=[state[f"precision.{i}"] for i in range(n_sites)],
            threshold=float(info["threshold"]),
            target_false_abstain=float(info["target_false_abstain"]),
            val_abstain_rate=float(info["val_abstain_rate"]),
        )


@dataclass(frozen=True)
class FeatureGaussian:
    """One site's feature distribution: mean and (Ledoit-Wolf) precision."""

    mean: torch.Tensor
    precision: torch.Tensor


def site_gaussian(
    model: FedModel, x: torch.Tensor, setup: DeviceSetup, site_id: str
) -> FeatureGaussian:
    """The Gaussian of ``model``'s backbone features on a site's training scans (its own view).

    Runs where the scans are: in the engine's process, or on the site's SuperNode.
    """
    from sklearn.covariance import LedoitWolf

    feats = run_model(model, x, setup, heads=None)[2].double().numpy()
    if feats.shape[0] < 2:
        raise DataError(
            f"site {site_id!r}: at least 2 training scans are needed to calibrate "
            "abstention; add scans or lower the site's split fractions"
        )
    lw = LedoitWolf().fit(feats)
    return FeatureGaussian(
        torch.from_numpy(lw.location_).float(), torch.from_numpy(lw.precision_).float()
    )


def uncalibrated(gaussians: list[FeatureGaussian], target_false_abstain: float) -> Abstention:
    """Abstention from every site's Gaussian, before its threshold is set (never abstains)."""
    return Abstention(
        [g.mean for g in gaussians],
        [g.precision for g in gaussians],
        float("inf"),
        target_false_abstain,
        0.0,
    )


def calibrate(abstention: Abstention, scores: list[np.ndarray]) -> Abstention:
    """Set the threshold so that about the target share of the validation ``scores`` (one array
    per site, computed where its scans are) abstain."""
    pooled = np.concatenate(scores) if scores else np.zeros(0)
    if pooled.size == 0:
        return abstention  # no validation scans anywhere: never abstain, and say so in info()
    abstention.threshold = float(np.quantile(pooled, 1.0 - abstention.target_false_abstain))
    abstention.val_abstain_rate = float((pooled > abstention.threshold).mean())
    return abstention
