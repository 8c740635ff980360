"""A trained federation held for inference: one model per site, their priors and normalizations.

Built either from the engine's in-memory states or from a run directory's ``model/`` folder, so
``medfed route``, ``medfed evaluate`` and the dashboard answer exactly as training measured.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medfed.config import SiteManifest, parse_manifest
from medfed.core.errors import RunDirError
from medfed.core.operating_rule import DEFAULT_OPERATING_RULE, OperatingRule
from medfed.data.preprocess import Normalization
from medfed.models.device import DeviceSetup, resolve_device
from medfed.models.encoder import FrozenEncoder
from medfed.models.fedmodel import HEAD_PREFIX, FedModel, ModelSpec, build_model
from medfed.models.forward import run_model
from medfed.models.mixture import COEFFICIENTS
from medfed.routing.abstention import Abstention
from medfed.runs import RunDir
from medfed.runs.weights import (
    MODEL_FIX,
    check_tensors,
    load_model_state,
    save_model,
    verify_folder,
)

State = dict[str, torch.Tensor]
ENCODER = "encoder"  # model/encoder.safetensors: the frozen encoder (--frozen-encoder)

# The version of the model a run's model.json describes: what its weights mean (the backbone's
# tensor names and shapes, the heads, the spec's fields). 1: runs written before model.json
# carried a version (read as before); 2: the torchvision-shaped backbones and the version itself.
MODEL_VERSION = 2


@dataclass(frozen=True)
class OperatingChoice:
    """A site's operating point: the threshold on P(positive) at or above which its model calls
    a scan positive, chosen on its validation split by ``rule`` (with that split's counts)."""

    rule: str
    threshold: float
    note: str | None
    n_val_pos: int
    n_val_neg: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperatingChoice:
        threshold = float(data["threshold"])
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"operating threshold {threshold} is outside [0, 1]")
        return cls(
            rule=str(data["rule"]),
            threshold=threshold,
            note=data.get("note"),
            n_val_pos=int(data["n_val_pos"]),
            n_val_neg=int(data["n_val_neg"]),
        )


@dataclass(frozen=True)
class SiteEntry:
    """What inference needs to know of one site (``operating``: None for runs written before
    operating points, and for tasks with more than two classes: then the argmax answers)."""

    id: str
    index: int
    prior: float
    normalization: Normalization
    manifest: SiteManifest
    operating: OperatingChoice | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": self.index,
            "prior": self.prior,
            "normalization": self.normalization.to_dict(),
            "manifest": self.manifest.to_dict(),
            "weights": f"site_{self.id}.safetensors",
            "operating": None if self.operating is None else self.operating.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SiteEntry:
        operating = data.get("operating")
        return cls(
            id=data["id"],
            index=int(data["index"]),
            prior=float(data["prior"]),
            normalization=Normalization.from_dict(data["normalization"]),
            manifest=manifest_from_dict(data["manifest"]),
            operating=None if operating is None else OperatingChoice.from_dict(operating),
        )


@dataclass(frozen=True)
class RoutingFit:
    """The routing posterior's calibration, fitted on the sites' validation scans when the
    federation is published and stored with the model (model.json ``routing``).

    ``temperature``: the density-ratio scores are divided by it before the softmax (fitted by
    the validation NLL of the true site). ``low_margin``: the top-2 margin of the calibrated
    posterior below which routing on validation was shown to be right less often than
    ``target`` (:func:`medfed.metrics.margin_threshold`); the review queue takes it as its
    low-margin line. ``band``: (validation scans below the line, of them routed right), shown
    with the line. ``n_val``: validation scans it was fitted on. A model without it (written
    before) routes at temperature 1.

    ``one_pass_site`` and ``one_pass_temperature``: the one-pass router reads the client head
    of one site's model only; this is the site whose model alone routed the validation scans
    best (by the NLL of the true site at its own fitted temperature). None for a federation
    whose sites share everything but their target heads (one pass routes with all of them)."""

    temperature: float
    low_margin: float
    target: float
    n_val: int
    one_pass_site: int | None = None
    one_pass_temperature: float | None = None
    band: tuple[int, int] | None = None

    def band_text(self) -> str:
        """``on validation, 23 scans lay below it, routed right 0.52 (0.33-0.71)``."""
        return band_text(self.band)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "low_margin": self.low_margin,
            "target": self.target,
            "n_val": self.n_val,
        }
        if self.one_pass_site is not None:
            out["one_pass_site"] = self.one_pass_site
            out["one_pass_temperature"] = self.one_pass_temperature
        if self.band is not None:
            out["low_margin_band"] = {"n": self.band[0], "correct": self.band[1]}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoutingFit:
        temperature = float(data["temperature"])
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError(f"routing temperature {temperature} is not a positive number")
        low_margin = float(data["low_margin"])
        if not 0.0 <= low_margin <= 1.0:
            raise ValueError(f"routing low_margin {low_margin} is outside [0, 1]")
        site, one_t = data.get("one_pass_site"), data.get("one_pass_temperature")
        if site is not None:
            site, one_t = int(site), float(one_t)
            if site < 0 or not (np.isfinite(one_t) and one_t > 0):
                raise ValueError(
                    f"routing one_pass_site {site} / one_pass_temperature {one_t} are not a "
                    "site index and a positive number"
                )
        band = data.get("low_margin_band")
        if band is not None:
            n, right = int(band["n"]), int(band["correct"])
            if not 0 <= right <= n:
                raise ValueError(f"routing low_margin_band {band} is not a count and its part")
            band = (n, right)
        n_val = int(data["n_val"])
        return cls(temperature, low_margin, float(data["target"]), n_val, site, one_t, band)


def band_text(band: tuple[int, int] | None) -> str:
    """What the low-margin line flagged on validation, with the Wilson interval of its
    routing accuracy; empty for a model published without it."""
    if band is None:
        return ""
    n, right = band
    if n == 0:
        return "on validation no scan lay below it"
    from medfed.metrics import wilson

    iv = wilson(right, n).interval
    return (
        f"on validation {n} scans lay below it, routed right {right / n:.2f} "
        f"({iv.low:.2f}-{iv.high:.2f})"
    )


def manifest_from_dict(data: dict[str, Any]) -> SiteManifest:
    """Rebuild a resolved manifest stored in model.json or config.toml."""
    fields = {k: v for k, v in data.items() if k != "manifest_path" and v is not None}
    where = data.get("manifest_path") or data.get("id", "stored manifest")
    return parse_manifest(fields, where=str(where), base_dir=Path("/"))


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
        routing: RoutingFit | None = None,
        operating_rule: str = DEFAULT_OPERATING_RULE,
        encoder: FrozenEncoder | None = None,
        encoder_info: dict[str, Any] | None = None,
    ) -> None:
        self.spec, self.algorithm, self.sites, self.setup = spec, algorithm, sites, setup
        # The run's --operating-point: endpoints chosen at evaluation (referable DR) follow it.
        self.operating_rule = str(OperatingRule.parse(operating_rule))
        self.abstention = abstention
        self.routing = routing
        # The frozen-encoder mode: every scan meets the encoder once, then the sites' models.
        self.encoder = None if encoder is None else encoder.to(setup.device)
        self.encoder_info = encoder_info
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
        # Which model this is (RunDir.model_id), set when it is loaded from a run; every
        # answer names it.
        self.model_id: str | None = None

    @property
    def routes(self) -> bool:
        return self.spec.client_branch

    @property
    def routing_temperature(self) -> float:
        """What the routing scores are divided by (1 for a model published before the fit)."""
        return 1.0 if self.routing is None else self.routing.temperature

    @property
    def priors(self) -> np.ndarray:
        return np.array([s.prior for s in self.sites])

    @property
    def thresholds(self) -> np.ndarray | None:
        """Each site's operating threshold on P(positive), or None when a site has none (a
        run written before operating points, or more than two classes): then argmax answers."""
        if any(s.operating is None for s in self.sites):
            return None
        return np.array([s.operating.threshold for s in self.sites])

    @property
    def modality(self) -> str:
        return str(self.sites[0].manifest.modality)

    def site_outputs(self, index: int, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        """Class probabilities and client logits of site ``index``'s model on ``x``."""
        probs, client, _ = self.site_pass(index, x)
        return probs, client

    @torch.no_grad()
    def site_pass(
        self, index: int, x: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray | None, torch.Tensor]:
        """Class probabilities, client logits and features of site ``index``'s model on ``x``."""
        probs, client, feats = run_model(self.models[index], x, self.setup, heads=None)
        return probs, self._present(client), feats

    def _present(self, client: np.ndarray | None) -> np.ndarray | None:
        """Client logits of the sites in this federation only."""
        if client is None or self.client_columns == list(range(client.shape[-1])):
            return client
        return client[..., self.client_columns]

    def position(self, site_id: str) -> int:
        """Where site ``site_id`` stands among this federation's sites."""
        return [s.id for s in self.sites].index(site_id)

    def abstention_scores(self, raw: torch.Tensor) -> np.ndarray:
        """Abstention scores of scans before normalization (each site sees them in its view)."""
        if self.abstention is None or raw.shape[0] == 0:
            return np.zeros(0)
        views = [s.normalization.apply(raw) for s in self.sites]
        return self.abstention.scores(self.outputs(views).features)

    def class_names(self) -> list[str]:
        return list(self.sites[0].manifest.class_names().values())

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
            "model_version": MODEL_VERSION,
            "algorithm": self.algorithm,
            "spec": self.spec.to_dict(),
            "modality": self.modality,
            "routes": self.routes,
            "classes": self.class_names(),
            "sites": [s.to_dict() for s in self.sites],
            "abstention": self.abstention.info() if self.abstention else None,
            **({"routing": self.routing.to_dict()} if self.routing else {}),
            "operating_rule": self.operating_rule,
            **({"encoder": self.encoder_info} if self.encoder is not None else {}),
            **(extra or {}),
        }

    def weights(self) -> dict[str, State]:
        """Every site's weights, and the abstention statistics, by file stem."""
        states = {f"site_{s.id}": st for s, st in zip(self.sites, self.states, strict=True)}
        if self.abstention is not None:
            states["abstention"] = self.abstention.state()
        if self.encoder is not None:
            states[ENCODER] = {k: v.cpu() for k, v in self.encoder.state_dict().items()}
        return states

    def save(self, run: RunDir, extra: dict[str, Any]) -> None:
        """model/: the weights (abstention's too), their files.json, then model.json."""
        save_model(run, self.describe(extra), self.weights())

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "auto") -> TrainedFederation:
        """The run's final model, every file checked first: model.json's fields, the weight
        files against model/files.json (when the run has one), each site's tensors against the
        model model.json describes, finite weights, one normalization value per channel."""
        run = RunDir(run_dir).require()
        info = run.read_model_json()
        _check_info(info, run.model_json_path)
        model_id = run.model_id()  # of files.json, which the weights are then checked against
        try:
            fed = cls._from_info(run, info, device)
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(
                f"{run.model_json_path}: incomplete or inconsistent ({exc!r}); "
                "the run may have been written by another medfed version, or damaged; "
                f"{MODEL_FIX}"
            ) from exc
        fed.model_id = model_id
        return fed

    @classmethod
    def _from_info(cls, run: RunDir, info: dict[str, Any], device: str) -> TrainedFederation:
        verify_folder(run.model_dir, MODEL_FIX)
        spec = ModelSpec.from_dict(info["spec"])
        expected = build_model(spec).state_dict()
        against = f"the {spec.backbone} model described in model.json"
        weights = {}
        for site in info["sites"]:
            name = f"site_{site['id']}"
            state = load_model_state(run, name)
            check_tensors(run.model_weights_path(name), state, expected, MODEL_FIX, against)
            _check_normalization(site, spec.in_channels, run.model_json_path)
            weights[name] = state
        if info.get("abstention"):
            path = run.model_weights_path("abstention")
            weights["abstention"] = load_model_state(run, "abstention")
            _check_abstention(path, weights["abstention"], len(info["sites"]))
        if info.get("encoder"):
            weights[ENCODER] = load_model_state(run, ENCODER)
            expected = frozen_encoder(info["encoder"]).state_dict()
            against = "the frozen encoder described in model.json"
            check_tensors(
                run.model_weights_path(ENCODER), weights[ENCODER], expected, MODEL_FIX, against
            )
        return cls.from_parts(info, weights, device)

    @classmethod
    def from_parts(
        cls, info: dict[str, Any], weights: dict[str, State], device: str = "auto"
    ) -> TrainedFederation:
        """Rebuild from :meth:`describe` and :meth:`weights` (read from disk or received)."""
        sites = [SiteEntry.from_dict(s) for s in info["sites"]]
        states = [weights[f"site_{s.id}"] for s in sites]
        abstention = None
        if info.get("abstention"):
            abstention = Abstention.load(weights["abstention"], info["abstention"], len(sites))
        spec = ModelSpec.from_dict(info["spec"])
        routing = RoutingFit.from_dict(info["routing"]) if info.get("routing") else None
        if routing is not None and (routing.one_pass_site or 0) >= len(sites):
            raise ValueError(f"routing one_pass_site {routing.one_pass_site} is not a site here")
        rule = info.get("operating_rule", DEFAULT_OPERATING_RULE)  # older runs: the default
        setup = resolve_device(device)
        encoder = None
        if info.get("encoder"):
            encoder = frozen_encoder(info["encoder"])
            encoder.load_state_dict(weights[ENCODER], strict=True)
        return cls(
            spec,
            info["algorithm"],
            sites,
            states,
            setup,
            abstention,
            routing,
            rule,
            encoder=encoder,
            encoder_info=info.get("encoder"),
        )


def frozen_encoder(info: dict[str, Any]) -> FrozenEncoder:
    """The frozen encoder model.json describes (its weights not yet loaded)."""
    return FrozenEncoder(str(info["backbone"]), int(info["unfreeze_blocks"]))


def _damaged(where: Path, what: str) -> RunDirError:
    return RunDirError(f"{where}: {what}; the file is damaged; {MODEL_FIX}")


def _check_version(info: dict[str, Any], where: Path) -> None:
    """A model this medfed can read: its model version (1 where model.json has none) at most
    :data:`MODEL_VERSION`, and a backbone this version knows."""
    from medfed.models.backbones import BACKBONES

    version = info.get("model_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _damaged(
            where, f"field 'model_version' should be a whole number >= 1, not {version!r}"
        )
    if version > MODEL_VERSION:
        raise RunDirError(
            f"{where}: the model is of model version {version}, written by a newer medfed; this "
            f"medfed reads model versions 1 to {MODEL_VERSION}: upgrade medfed to load it"
        )
    spec = info["spec"]
    backbone = spec.get("backbone")
    if backbone not in BACKBONES:
        raise RunDirError(
            f"{where}: backbone {backbone!r} (model version {version}) is not one this medfed "
            f"version builds (it builds: {', '.join(BACKBONES)}); load the run with the medfed "
            "version that trained it, or retrain it"
        )


def _check_info(info: dict[str, Any], where: Path) -> None:
    """model.json's fields that loading relies on, each of the right kind, of a model version
    and backbone this medfed reads."""
    if not isinstance(info.get("algorithm"), str):
        raise _damaged(where, "field 'algorithm' should be the algorithm's name")
    if not isinstance(info.get("spec"), dict):
        raise _damaged(where, "field 'spec' should be a JSON object (the model's settings)")
    sites = info.get("sites")
    if not isinstance(sites, list) or not sites:
        raise _damaged(where, "field 'sites' should be a non-empty list of sites")
    for k, site in enumerate(sites):
        if not isinstance(site, dict) or not isinstance(site.get("id"), str) or not site["id"]:
            raise _damaged(where, f"sites[{k}] should be a JSON object with the site's 'id'")
        if not isinstance(site.get("normalization"), dict):
            raise _damaged(where, f"site {site['id']!r}: 'normalization' should be an object")
    abstention = info.get("abstention")
    if abstention is not None and not isinstance(abstention, dict):
        raise _damaged(where, "field 'abstention' should be a JSON object or null")
    routing = info.get("routing")
    if routing is not None and not isinstance(routing, dict):
        raise _damaged(where, "field 'routing' should be a JSON object (the routing fit)")
    _check_version(info, where)


def _check_normalization(site: dict[str, Any], channels: int, where: Path) -> None:
    """One finite mean and one positive, finite std per input channel (a list of another
    length would broadcast silently and answer every scan from wrongly scaled pixels)."""
    norm = site["normalization"]
    for key in ("mean", "std"):
        values = norm.get(key)
        ok = isinstance(values, list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        )
        if not ok:
            raise _damaged(where, f"site {site['id']!r}: normalization {key} should be numbers")
        if len(values) != channels:
            raise _damaged(
                where,
                f"site {site['id']!r}: normalization {key} has {len(values)} value(s), but the "
                f"model takes {channels} channel(s)",
            )
        if not all(np.isfinite(values)) or (key == "std" and min(values) <= 0):
            raise _damaged(where, f"site {site['id']!r}: normalization {key} {values} is unusable")


def _check_abstention(path: Path, state: State, n_sites: int) -> None:
    """One feature mean (D,) and precision (D, D) per site, nothing else."""
    wanted = {f"{kind}.{i}" for i in range(n_sites) for kind in ("mean", "precision")}
    if set(state) != wanted:
        odd = sorted(set(state) ^ wanted)
        raise RunDirError(
            f"{path}: tensors {odd[:4]} do not match the {n_sites} site(s) of model.json; "
            f"{MODEL_FIX}"
        )
    dim = state["mean.0"].shape
    for i in range(n_sites):
        mean, precision = state[f"mean.{i}"], state[f"precision.{i}"]
        if mean.ndim != 1 or mean.shape != dim or tuple(precision.shape) != (dim[0], dim[0]):
            raise RunDirError(
                f"{path}: site {i}'s feature statistics have shapes {list(mean.shape)} and "
                f"{list(precision.shape)}, expected [{dim[0]}] and [{dim[0]}, {dim[0]}]; "
                f"{MODEL_FIX}"
            )


def _only_heads_differ(states: list[State]) -> bool:
    """True when every site shares all weights but its target head (FedDRM, FedRep)."""
    first = states[0]
    for state in states[1:]:
        for key, value in state.items():
            if not key.startswith(HEAD_PREFIX) and not torch.equal(value, first[key]):
                return False
    return True


def mixture_coefficients(run_dir: str | Path) -> dict[str, list[float]]:
    """Each site's FedGMI mixture coefficients, from a finished run's saved model."""
    run = RunDir(run_dir).require()
    info = run.read_model_json()
    verify_folder(run.model_dir, MODEL_FIX)
    out = {}
    for site in info["sites"]:
        state = load_model_state(run, f"site_{site['id']}")
        if COEFFICIENTS not in state:
            raise RunDirError(
                f"{run.model_dir}: a {info.get('algorithm')!r} run has no mixture coefficients "
                "(only fedgmi runs do)"
            )
        out[site["id"]] = state[COEFFICIENTS].tolist()
    return out
