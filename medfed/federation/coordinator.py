"""The server's side of a federation: global state, rounds, aggregation, the run directory.

It never sees a scan: what it knows of a site is a :class:`SiteInfo` (id, label map, input
shape, number of training scans). The in-process engine and the Flower ServerApp both drive a
:class:`Coordinator`, so both apply the same sharing rule, schedule and aggregation.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch

from medfed import __version__
from medfed.algorithms import dp_algorithms, make_algorithm
from medfed.algorithms.base import Algorithm, State, Update
from medfed.algorithms.privacy import check_model as check_dp_model
from medfed.config import Modality, TrainConfig
from medfed.data.modality import modality_spec
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.errors import ConfigError, RunDirError
from medfed.federation import wire
from medfed.federation.pretrained import InitReport, apply_init, resolve_init
from medfed.federation.site import clone_state, cosine_lr, derive_seed
from medfed.federation.validate import UpdateRejected, validate_update
from medfed.federation.wire import WireFormat
from medfed.fileio import check_out_folder
from medfed.models.backbones import BACKBONES, spatial_dims
from medfed.models.device import DeviceSetup
from medfed.models.fedmodel import FedModel, ModelSpec, build_model
from medfed.runs import RunDir
from medfed.runs.checkpoints import CheckpointStore, damaged_fix
from medfed.runs.schema import Evaluation, PrivacySpent, RunCosts, Summary, WireSettings
from medfed.runs.weights import check_tensors


@dataclass(frozen=True)
class SiteInfo:
    """What the server may know of a site: no scans, only their shape and counts."""

    id: str
    modality: str
    labels: dict[str, int]
    input_shape: tuple[int, ...]
    n_train: int
    manifest: dict[str, Any]

    @classmethod
    def of(cls, site: SiteData) -> SiteInfo:
        return cls(
            id=site.id,
            modality=str(site.manifest.modality),
            labels=dict(site.manifest.labels),
            input_shape=tuple(int(d) for d in site.x[Split.TRAIN].shape[1:]),
            n_train=site.n(Split.TRAIN),
            manifest=site.manifest.to_dict(),
        )

    @property
    def n_classes(self) -> int:
        return len(set(self.labels.values()))


def default_backbone(modality: Modality, algorithm: Algorithm) -> str:
    """GroupNorm backbones by default; BatchNorm ones for algorithms that keep normalization
    layers on each site (FedBN, and FedDRM unless ``private_norms=false``).

    Shared BatchNorm is a poor default here: every training batch holds one site's scans only,
    so batch statistics wipe out the very site differences, and averaged running statistics fit
    no site (the reference FedDRM code shares everything and uses GroupNorm).
    """
    return modality_spec(modality).default_backbone(algorithm.prefers_batch_norm())


def resolved_backbone(config: TrainConfig, modality: Modality, algorithm: Algorithm) -> str:
    """The run's backbone: ``config.backbone``, or the modality's default for ``auto``; refuses
    a backbone made for the other modality's scans before anything trains."""
    if config.backbone == "auto":
        if config.dp.enabled:
            return modality_spec(modality).default_backbone(False, private=True)
        return default_backbone(modality, algorithm)
    dims = modality_spec(modality).spatial_dims
    if spatial_dims(config.backbone) != dims:
        fits = [name for name in BACKBONES if spatial_dims(name) == dims]
        raise ConfigError(
            f"training setting: backbone (--backbone) {config.backbone!r} takes "
            f"{spatial_dims(config.backbone)}-D scans, but these sites hold {modality} scans "
            f"({dims}-D); choose auto or one of {', '.join(fits)}"
        )
    return config.backbone


def refuse_private(algorithm: Algorithm, config: TrainConfig) -> None:
    """Refuse, before anything trains, differential privacy for an algorithm that cannot have
    it."""
    if config.dp.enabled and algorithm.dp_refusal:
        raise ConfigError(
            f"{algorithm.run_name} cannot train under differential privacy (--dp-epsilon, "
            f"--dp-noise): {algorithm.dp_refusal}. Choose one of {dp_algorithms()}"
        )


def initial_model(spec: ModelSpec, algorithm: Algorithm, seed: int, setup: DeviceSetup) -> FedModel:
    """The model every site starts from: the same weights wherever it is built."""
    torch.manual_seed(derive_seed(seed, 0))
    model = build_model(spec).to(setup.device)
    algorithm.initialize(model, seed)
    if setup.channels_last and spatial_dims(spec.backbone) == 2:
        model = model.to(memory_format=torch.channels_last)
    return model


def check_federation(sites: list[SiteInfo], config: TrainConfig) -> Modality:
    """Refuse a federation that could not train together; returns its modality."""
    if not sites:
        raise ConfigError("no sites to train on")
    ids = [s.id for s in sites]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"site ids must be unique, got {ids}")
    modalities = {s.modality for s in sites}
    if len(modalities) > 1:
        raise ConfigError(f"all sites must share one modality, got {sorted(modalities)}")
    if config.min_sites > len(sites):
        raise ConfigError(
            f"min_sites={config.min_sites} but only {len(sites)} site(s) were given: "
            "no round could ever aggregate; lower --min-sites"
        )
    label_maps = {s.id: s.labels for s in sites}
    if len({tuple(sorted(m.items())) for m in label_maps.values()}) > 1:
        raise ConfigError(
            f"sites declare different [labels] {label_maps}; a federation needs one label "
            "map (same class names and indices) at every site"
        )
    shapes = {s.id: s.input_shape for s in sites}
    if len(set(shapes.values())) > 1:
        raise ConfigError(
            f"sites preprocess to different input shapes {shapes}; give every site the "
            "same preprocess image_size (fundus) or shape (CT)"
        )
    return Modality(modalities.pop())


@dataclass
class RoundPlan:
    """What the server sends in one round."""

    round: int
    lr: float
    sampled: set[int]
    keys: list[str]
    outgoing: State
    dtypes: State
    shared_payload: bytes


@dataclass
class Downlink:
    payload: bytes
    held: State  # the global state the site rebuilds from the payload


class Coordinator:
    """Global state, round plans, aggregation, checkpoints and the summary of one run."""

    def __init__(
        self,
        sites: list[SiteInfo],
        algorithm: Algorithm,
        config: TrainConfig,
        run: RunDir,
        setup: DeviceSetup,
        *,
        init: str | None = None,
    ) -> None:
        """``init``: starting weights in place of ``config.init`` (a run's own warm-up base)."""
        self.modality = check_federation(sites, config)
        config.check_faults([s.id for s in sites], communicates=algorithm.communicates)
        self.sites, self.algorithm, self.config, self.run, self.setup = (
            sites,
            algorithm,
            config,
            run,
            setup,
        )
        first = sites[0]
        self.spec = ModelSpec(
            backbone=resolved_backbone(config, self.modality, algorithm),
            in_channels=int(first.input_shape[0]),
            n_classes=first.n_classes,
            n_sites=len(sites),
            client_branch=algorithm.needs_client_branch,
        )
        self.spec = algorithm.adapt_spec(self.spec, [s.id for s in sites])
        source = init or config.init
        refuse_private(algorithm, config)
        algorithm.check_start(bool(source))
        self.model = initial_model(self.spec, algorithm, config.seed, setup)
        algorithm.check(self.model)
        if config.dp.enabled:
            check_dp_model(self.model, self.spec.backbone)
        # Starting weights (--init): loaded here, on the server, and sent to every site.
        self.init_report: InitReport | None = None
        if source:
            self.init_report = apply_init(
                self.model, resolve_init(source), strict=config.init_strict
            )
        self.store = CheckpointStore(run.checkpoints, config.keep_checkpoints)
        # What the run records as its device (the in-process engine adds how its sites share it).
        self.device_text = setup.describe()
        self.initial_state = clone_state(self.model.state_dict())
        self.shared_keys = algorithm.shared_keys(self.model) if algorithm.communicates else []
        self.global_state: State = {k: self.initial_state[k].clone() for k in self.shared_keys}
        self.wire = WireFormat(config.wire_precision, config.wire_delta)
        # What each site holds of the global state (delta encoding sends differences to it).
        self.held: list[State] = [
            {k: v.cpu().clone() for k, v in self.global_state.items()} for _ in sites
        ]
        # What a site must be given besides the seed to build the same starting model.
        self.init_state: State = {
            k: self.initial_state[k].cpu()
            for k in (self.init_report.loaded if self.init_report else [])
        }
        self.resumed_from: Path | None = None  # the checkpoint a resumed run started from
        total = sum(s.n_train for s in sites)
        self.priors = np.array([s.n_train / total for s in sites])

    # ------------------------------------------------------------------ config and resume
    def resolved_config(self) -> dict[str, Any]:
        config = {
            "medfed_version": __version__,
            "train": self.config.to_dict() | {"params": self.algorithm.resolved_params()},
            "model": self.spec.to_dict(),
            "sites": [s.manifest for s in self.sites],
        }
        if self.init_report is not None:
            config["init"] = self.init_report.to_dict() | {
                "strict": self.config.init_strict,
                "normalization": self.config.normalization,
            }
        return config

    def _init_event(self) -> None:
        report = self.init_report
        if report is not None:
            self.run.log_event(
                "init",
                source=report.source,
                sha256=report.sha256,
                loaded=len(report.loaded),
                skipped=len(report.skipped),
                random=len(report.random),
            )

    def _check_same_init(self, previous: dict[str, Any]) -> None:
        """A resumed run starts from the weights it started from: their hash must match."""
        before = previous.get("init")
        before_hash = before.get("sha256") if isinstance(before, dict) else None
        now = self.init_report.sha256 if self.init_report else None
        if before_hash != now:
            source = self.init_report.source if self.init_report else "random weights"
            raise ConfigError(
                f"--resume: the starting weights ({source}) are not those the run in "
                f"{self.run.path} started from (config.toml [init] sha256 "
                f"{before_hash or 'none'}, now {now or 'none'}); restore the --init file the "
                "run started from, or train again into a new --out"
            )

    def start(self, resume: bool, **event: Any) -> tuple[int, dict[str, State]]:
        """The first round to run, and the checkpointed states when resuming."""
        config = self.resolved_config()
        if not resume:
            if self.run.config_path.exists():
                raise ConfigError(
                    f"{self.run.path} already holds a run; pass --resume to continue it "
                    "or choose another --out"
                )
            check_out_folder(self.run.path)
            self.run.path.mkdir(parents=True, exist_ok=True)
            self.run.write_config(config)
            self.run.log_event("start", device=self.device_text, **event)
            self._init_event()
            return 1, {}
        if not self.run.config_path.exists():
            raise ConfigError(f"--resume: {self.run.path} holds no run to resume")
        previous = self.run.read_config()
        for table, kind in (("train", dict), ("sites", list)):
            if not isinstance(previous.get(table), kind):
                raise RunDirError(
                    f"{self.run.config_path}: no usable {table!r} "
                    f"{'table' if kind is dict else 'list'}; the file is damaged; restore it "
                    "from the run's backup, or train again into a new --out without --resume"
                )
        config = tomllib.loads(tomli_w.dumps(config))  # as stored: tuples become lists
        stored = dict(previous["train"])
        if "algorithm" in stored:  # runs written before config.toml resolved every parameter
            algorithm = make_algorithm(str(stored["algorithm"]), stored.get("params") or {})
            stored["params"] = tomllib.loads(tomli_w.dumps(algorithm.resolved_params()))
        for name, value in self.config.to_dict().items():  # settings added since it started
            if name not in stored and value == TrainConfig.__dataclass_fields__[name].default:
                stored[name] = value
        if stored != config["train"] or previous.get("sites") != config["sites"]:
            raise ConfigError(
                f"--resume: the settings differ from the run in {self.run.path} "
                "(config.toml); resume with the same sites and options"
            )
        self._check_same_init(previous)
        latest = self.store.latest()
        if latest is None:
            self.run.truncate_metrics(0)
            self.run.log_event("resume", from_round=0, **event)
            return 1, {}
        states, meta = self.store.load(latest)
        done = int(meta["round"])
        fix = damaged_fix(latest)
        if done > self.config.rounds:
            raise RunDirError(
                f"{latest / 'state.json'}: round {done} is past the run's last round "
                f"({self.config.rounds} in config.toml); {fix}"
            )
        against = "the model config.toml describes"
        expected = {k: v.cpu() for k, v in self.global_state.items()}
        named = {"global": expected}
        if self.wire.delta:  # what each site holds of the global state
            named |= {f"held_{site.id}": expected for site in self.sites}
        for name, want in named.items():
            path = latest / f"{name}.safetensors"
            if name not in states:
                raise RunDirError(f"{path}: missing; the checkpoint is incomplete; {fix}")
            check_tensors(path, states[name], want, fix, against)
        self.global_state = {k: v.to(self.setup.device) for k, v in states["global"].items()}
        if self.wire.delta:
            self.held = [states[f"held_{site.id}"] for site in self.sites]
        self.resumed_from = latest
        self.run.truncate_metrics(done)
        self.run.log_event("resume", from_round=done, **event)
        return done + 1, states

    def checkpoint(self, round_: int, site_states: dict[str, State] | None = None) -> None:
        states: dict[str, State] = {"global": self.global_state, **(site_states or {})}
        if self.wire.delta:
            for site, held in zip(self.sites, self.held, strict=True):
                states[f"held_{site.id}"] = held
        self.store.save(round_, states)

    # ------------------------------------------------------------------ one round
    def sample(self, round_: int) -> set[int]:
        k = len(self.sites)
        m = max(self.config.min_sites, math.ceil(self.config.client_fraction * k))
        if m >= k:
            return set(range(k))
        rng = np.random.default_rng(derive_seed(self.config.seed, round_, 1_000_003))
        return set(rng.choice(k, size=m, replace=False).tolist())

    def plan(self, round_: int) -> RoundPlan:
        keys = (
            self.algorithm.round_keys(self.model, round_, self.config.rounds)
            if self.shared_keys
            else []
        )
        outgoing = {k: self.global_state[k] for k in keys}
        shared = wire.encode(outgoing, self.wire) if keys and not self.wire.delta else b""
        return RoundPlan(
            round=round_,
            lr=cosine_lr(self.config.lr, round_, self.config.rounds),
            sampled=self.sample(round_),
            keys=keys,
            outgoing=outgoing,
            dtypes={k: v.cpu() for k, v in outgoing.items()},
            shared_payload=shared,
        )

    def downlink(self, index: int, plan: RoundPlan) -> Downlink:
        """What the server sends site ``index`` this round.

        With delta encoding each site gets the difference to the global state it already holds
        (tracked per site, so quantization errors never accumulate); otherwise one payload
        serves every site.
        """
        if not plan.outgoing:
            return Downlink(b"", {})
        payload = plan.shared_payload
        held = {k: self.held[index][k] for k in plan.outgoing} if self.wire.delta else None
        if self.wire.delta:
            payload = wire.encode(plan.outgoing, self.wire, reference=held)
        return Downlink(payload, wire.decode(payload, reference=held, dtypes=plan.outgoing))

    def receive(self, index: int, plan: RoundPlan, down: Downlink, payload_up: bytes) -> State:
        """Decode and check a site's update; raises when it is unusable."""
        if not plan.keys:
            return {}
        reference = down.held if self.wire.delta else None
        received = wire.decode(payload_up, reference=reference, dtypes=plan.dtypes)
        validate_update(self.sites[index].id, received, plan.dtypes)
        return received

    def accepted(self, index: int, down: Downlink) -> None:
        """Site ``index`` now holds what it was sent."""
        if self.wire.delta:
            self.held[index].update(down.held)

    def aggregate(self, round_: int, updates: list[Update]) -> bool:
        if not self.shared_keys:
            return True
        ok = len(updates)
        if ok < self.config.min_sites:
            self.run.log_event(
                "round_skipped",
                round=round_,
                reason=f"{ok} usable update(s), fewer than min_sites={self.config.min_sites}",
            )
            return False
        aggregated = self.algorithm.aggregate(updates)
        # A schedule (FedALS) may aggregate only part of the shared keys this round.
        self.global_state.update({k: v.to(self.setup.device) for k, v in aggregated.items()})
        return True

    def aggregate_secure(
        self, round_: int, plan: RoundPlan, mean: State | None, contributors: int, reason: str
    ) -> bool:
        """Take a secure sum's weighted mean (``mean``: the new shared state) as the round's
        aggregate, after checking it; ``reason``: why there is none."""
        if mean is not None and contributors < self.config.min_sites:
            reason = (
                f"{contributors} update(s) in the secure sum, fewer than "
                f"min_sites={self.config.min_sites}"
            )
        if mean is not None and not reason:
            try:
                validate_update("(the secure sum)", mean, plan.dtypes)
            except UpdateRejected as exc:
                reason = str(exc)
        if mean is None or reason:
            self.run.log_event("round_skipped", round=round_, reason=reason or "no secure sum")
            return False
        self.global_state.update({k: v.to(self.setup.device) for k, v in mean.items()})
        return True

    # ------------------------------------------------------------------ the summary
    def summary(
        self,
        evaluation: Evaluation,
        *,
        engine: str | None = None,
        lost_sites: dict[str, str] | None = None,
        privacy: dict[str, PrivacySpent] | None = None,
    ) -> Summary:
        """summary.json: the evaluation, the run's settings and what its rounds cost (from
        metrics.jsonl). ``engine`` and ``lost_sites``: a Flower deployment's; ``privacy``: what
        each site spent of its differential privacy budget."""
        return Summary.build(
            evaluation,
            RunCosts.of(self.run.read_metrics(), [site.id for site in self.sites]),
            algorithm=self.algorithm.run_name,
            params=self.algorithm.resolved_params(),
            rounds=self.config.rounds,
            local_steps=self.config.local_steps,
            seed=self.config.seed,
            backbone=self.spec.backbone,
            modality=str(self.modality),
            device=self.device_text,
            priors={s.id: float(p) for s, p in zip(self.sites, self.priors, strict=True)},
            wire=WireSettings(self.wire.precision, self.wire.delta),
            resumes=sum(1 for e in self.run.read_events() if e.get("event") == "resume"),
            engine=engine,
            lost_sites=lost_sites,
            normalization=self.config.normalization,
            augment=self.config.augment,
            operating_rule=self.config.operating_point,
            privacy=privacy,
        )
