"""A trained federation held for inference: one model per site, their priors and normalizations.

Built either from the engine's in-memory states or from a run directory's ``model/`` folder, so
``medfed route``, ``medfed evaluate`` and the dashboard answer exactly as training measured.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.algorithms.base import HEAD_PREFIX
from medfed.config import SiteManifest, parse_manifest
from medfed.data.preprocess import Normalization
from medfed.errors import DataError, RunDirError
from medfed.federation.device import DeviceSetup, resolve_device
from medfed.models.fedmodel import FedModel, ModelSpec, build_model
from medfed.runs import RunDir, load_state, save_state

State = dict[str, torch.Tensor]
BATCH = 256


@dataclass(frozen=True)
class SiteEntry:
    """What inference needs to know of one site."""

    id: str
    index: int
    prior: float
    normalization: Normalization
    manifest: SiteManifest

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": self.index,
            "prior": self.prior,
            "normalization": self.normalization.to_dict(),
            "manifest": self.manifest.to_dict(),
            "weights": f"site_{self.id}.safetensors",
        }


def manifest_from_dict(data: dict[str, Any]) -> SiteManifest:
    """Rebuild a resolved manifest stored in model.json or config.toml."""
    fields = {k: v for k, v in data.items() if k != "manifest_path" and v is not None}
    where = data.get("manifest_path") or data.get("id", "stored manifest")
    return parse_manifest(fields, where=str(where), base_dir=Path("/"))


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
        per_site = []
        for f, mean, precision in zip(features, self.means, self.precisions, strict=True):
            d = f.double() - mean.double()
            per_site.append(((d @ precision.double()) * d).sum(dim=1))
        closest = torch.stack(per_site, dim=1).min(dim=1).values
        return closest.clamp_min(0).sqrt().cpu().numpy()  # rounding can dip just below 0

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


@dataclass
class SiteOutputs:
    """Every site model's answer to the same scans, each on its own view of them."""

    class_probs: np.ndarray  # (K sites, n, C)
    client_logits: np.ndarray | None  # (K, n, K): site i's client logits on its view
    features: list[torch.Tensor]  # K tensors (n, D)


class TrainedFederation:
    """The sites' final models, ready to answer scans."""

    def __init__(
        self,
        spec: ModelSpec,
        algorithm: str,
        sites: list[SiteEntry],
        states: list[State],
        setup: DeviceSetup,
        abstention: Abstention | None = None,
    ) -> None:
        self.spec, self.algorithm, self.sites, self.setup = spec, algorithm, sites, setup
        self.abstention = abstention
        base = build_model(spec).to(setup.device).eval()
        self.models: list[FedModel] = []
        for site, state in zip(sites, states, strict=True):
            model = copy.deepcopy(base)
            model.load_state_dict(state)
            if spec.lora_adapters:
                model.select_adapter(model.adapter_for(site.id))
            self.models.append(model)
        self.states = states
        self.shared_body = _only_heads_differ(states)
        # The client head scores every site that trained; a site lost before the end of a
        # deployed run has no model here, so its column is left out.
        self.client_columns = [s.index for s in sites]

    @property
    def routes(self) -> bool:
        return self.spec.client_branch

    @property
    def priors(self) -> np.ndarray:
        return np.array([s.prior for s in self.sites])

    @property
    def modality(self) -> str:
        return str(self.sites[0].manifest.modality)

    def site_outputs(self, index: int, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """Class probabilities and client logits of site ``index``'s model on ``x``."""
        probs, client, _ = run_model(self.models[index], x, self.setup, heads=None)
        return probs, self._present(client)

    def _present(self, client: np.ndarray | None) -> np.ndarray | None:
        """Client logits of the sites in this federation only."""
        if client is None or self.client_columns == list(range(client.shape[-1])):
            return client
        return client[..., self.client_columns]

    def class_names(self) -> list[str]:
        names: dict[int, list[str]] = {}
        for name, index in self.sites[0].manifest.labels.items():
            names.setdefault(index, []).append(name)
        return ["/".join(sorted(names[i])) for i in sorted(names)]

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def outputs(self, views: list[torch.Tensor]) -> SiteOutputs:
        """Site i's model on ``views[i]`` for every i (one batched pass when only heads differ)."""
        if self.shared_body:
            return self._shared_outputs(views)
        probs, clients, feats = [], [], []
        for model, view in zip(self.models, views, strict=True):
            p, c, f = run_model(model, view, self.setup, heads=None)
            probs.append(p), clients.append(c), feats.append(f)
        client = np.stack(clients) if clients[0] is not None else None
        return SiteOutputs(np.stack(probs), self._present(client), feats)

    def _shared_outputs(self, views: list[torch.Tensor]) -> SiteOutputs:
        n = views[0].shape[0]
        heads = [m.target_head for m in self.models]
        p, c, f = run_model(self.models[0], torch.cat(views), self.setup, heads=heads)
        k = len(views)
        feats = list(f.split(n))
        client = c.reshape(k, n, -1) if c is not None else None
        return SiteOutputs(p.reshape(k, n, -1), self._present(client), feats)

    # ------------------------------------------------------------------ persistence
    def describe(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """model.json: everything but the weights."""
        return {
            "algorithm": self.algorithm,
            "spec": self.spec.to_dict(),
            "modality": self.modality,
            "routes": self.routes,
            "classes": self.class_names(),
            "sites": [s.to_dict() for s in self.sites],
            "abstention": self.abstention.info() if self.abstention else None,
            **(extra or {}),
        }

    def weights(self) -> dict[str, State]:
        """Every site's weights, and the abstention statistics, by file stem."""
        states = {f"site_{s.id}": st for s, st in zip(self.sites, self.states, strict=True)}
        if self.abstention is not None:
            states["abstention"] = self.abstention.state()
        return states

    def save(self, run: RunDir, extra: dict[str, Any]) -> None:
        weights = self.weights()
        abstention = weights.pop("abstention", None)
        run.save_model(self.describe(extra), weights)
        if abstention is not None:
            save_state(run.model_dir / "abstention.safetensors", abstention)

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "auto") -> TrainedFederation:
        run = RunDir(run_dir).require()
        info = run.read_model_json()
        try:
            return cls._from_info(run, info, device)
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(
                f"{run.model_dir / 'model.json'}: incomplete or inconsistent ({exc!r}); "
                "the run may have been written by another medfed version, or damaged"
            ) from exc

    @classmethod
    def _from_info(cls, run: RunDir, info: dict[str, Any], device: str) -> TrainedFederation:
        weights = {
            f"site_{s['id']}": run.load_model_state(f"site_{s['id']}") for s in info["sites"]
        }
        if info.get("abstention"):
            weights["abstention"] = load_state(run.model_dir / "abstention.safetensors")
        return cls.from_parts(info, weights, device)

    @classmethod
    def from_parts(
        cls, info: dict[str, Any], weights: dict[str, State], device: str = "auto"
    ) -> TrainedFederation:
        """Rebuild from :meth:`describe` and :meth:`weights` (read from disk or received)."""
        sites = [
            SiteEntry(
                id=s["id"],
                index=int(s["index"]),
                prior=float(s["prior"]),
                normalization=Normalization.from_dict(s["normalization"]),
                manifest=manifest_from_dict(s["manifest"]),
            )
            for s in info["sites"]
        ]
        states = [weights[f"site_{s.id}"] for s in sites]
        abstention = None
        if info.get("abstention"):
            abstention = Abstention.load(weights["abstention"], info["abstention"], len(sites))
        spec = ModelSpec.from_dict(info["spec"])
        return cls(spec, info["algorithm"], sites, states, resolve_device(device), abstention)


def _only_heads_differ(states: list[State]) -> bool:
    """True when every site shares all weights but its target head (FedDRM, FedRep)."""
    first = states[0]
    for state in states[1:]:
        for key, value in state.items():
            if not key.startswith(HEAD_PREFIX) and not torch.equal(value, first[key]):
                return False
    return True


@torch.no_grad()
def run_model(
    model: FedModel, x: torch.Tensor, setup: DeviceSetup, heads: list | None
) -> tuple[np.ndarray, np.ndarray | None, torch.Tensor]:
    """Class probabilities, client logits and backbone features of ``model`` on ``x``.

    With ``heads``, ``x`` holds len(heads) equal-sized blocks and block i uses head i.
    """
    model.eval()
    probs, clients, feats = [], [], []
    block = x.shape[0] // len(heads) if heads else x.shape[0]
    for start in range(0, x.shape[0], BATCH):
        xb = x[start : start + BATCH].to(setup.device)
        with setup.autocast()():
            f = model.features(xb)
            hidden = model.target_branch(f)
            if heads is None:
                logits = model.target_head(hidden)
            else:
                owner = torch.arange(start, start + xb.shape[0], device=xb.device) // block
                logits = torch.stack([h(hidden) for h in heads])[owner, torch.arange(len(xb))]
            client = None
            if model.client_branch is not None and model.client_head is not None:
                client = model.client_head(model.client_branch(f))
        probs.append(torch.softmax(logits.float(), dim=1).cpu())
        feats.append(f.float().cpu())
        if client is not None:
            clients.append(client.float().cpu())
    p = torch.cat(probs).numpy().astype(np.float64)
    c = torch.cat(clients).numpy().astype(np.float64) if clients else None
    return p, c, torch.cat(feats)


@torch.no_grad()
def site_features(fed: TrainedFederation, index: int, x: torch.Tensor) -> torch.Tensor:
    """Backbone features of site ``index``'s model on ``x`` (already in that site's view)."""
    return run_model(fed.models[index], x, fed.setup, heads=None)[2]


def site_gaussian(fed: TrainedFederation, index: int, x: torch.Tensor):
    """Mean and (Ledoit-Wolf) precision of site ``index``'s features on its training scans."""
    from sklearn.covariance import LedoitWolf

    feats = site_features(fed, index, x).double().numpy()
    if feats.shape[0] < 2:
        raise DataError(
            f"site {fed.sites[index].id!r}: at least 2 training scans are needed to calibrate "
            "abstention; add scans or lower the site's split fractions"
        )
    lw = LedoitWolf().fit(feats)
    return torch.from_numpy(lw.location_).float(), torch.from_numpy(lw.precision_).float()


def calibrate(abstention: Abstention, scores: np.ndarray) -> Abstention:
    """Set the threshold so that about the target share of ``scores`` (validation) abstain."""
    if scores.size == 0:
        return abstention  # no validation scans anywhere: never abstain, and say so in info()
    abstention.threshold = float(np.quantile(scores, 1.0 - abstention.target_false_abstain))
    abstention.val_abstain_rate = float((scores > abstention.threshold).mean())
    return abstention


def fit_abstention(
    fed: TrainedFederation,
    train_views: list[torch.Tensor],
    val_views: list[list[torch.Tensor]],
    target_false_abstain: float = 0.05,
) -> Abstention:
    """Fit each site's feature Gaussian on its training split; set the threshold so that about
    ``target_false_abstain`` of the sites' validation scans abstain.

    ``train_views[i]``: site i's training scans in its own view; ``val_views[j]``: site j's
    validation scans as every site sees them.
    """
    gaussians = [site_gaussian(fed, i, x) for i, x in enumerate(train_views)]
    abstention = Abstention(
        [m for m, _ in gaussians],
        [p for _, p in gaussians],
        float("inf"),
        target_false_abstain,
        0.0,
    )
    scores = [
        abstention.scores(fed.outputs(views).features) for views in val_views if len(views[0])
    ]
    return calibrate(abstention, np.concatenate(scores) if scores else np.zeros(0))
