"""What one hospital's SuperNode knows and keeps: its site, and its weights between messages.

The SuperNode is started with ``--node-config 'manifest="/path/site.toml" state-dir="/path"'``
(optional: ``cache-dir``, ``device``). Its weights, private state (FedDRM's target head, FedBN's
norm layers, LoRA adapters, Ditto's personal model) and the global state it last received are
checkpointed after every round under ``state-dir/<run>/<site>/round_NNNN/`` by the same
:class:`~medfed.runs.checkpoints.CheckpointStore` as the server's, so a node that restarts, or a
resumed run, continues from the last round it finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import secrets
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from medfed.algorithms.privacy import SitePrivacy
from medfed.config import TrainConfig, load_manifest
from medfed.core.errors import ConfigError, RunDirError
from medfed.core.fileio import atomic_write
from medfed.data.cache import TensorCache, default_cache_dir
from medfed.data.records import Split
from medfed.data.sitedata import SiteData, load_site
from medfed.federation import wire
from medfed.federation.normalizing import normalized
from medfed.federation.plan import SiteInfo, initial_model, settled_algorithm
from medfed.federation.pretrained import (
    HASH_MATCHES,
    resolve_init,
    state_sha256,
    torchvision_hash_check,
)
from medfed.federation.shared import clone_state
from medfed.federation.site import SiteWorker, planned_dp_steps
from medfed.federation.training import frozen_features
from medfed.models.device import resolve_device
from medfed.models.fedmodel import ModelSpec
from medfed.runs.checkpoints import CheckpointStore
from medfed.runs.weights import load_state, save_state

NOISE_KEY = "dp_noise.key"
"""The file in a site's state folder that holds its secret for DP-SGD's batches and noise."""
NOISE_KEY_BYTES = 32
PLANNED_NOISE = "dp_noise.json"
"""The noise multiplier the site's budget allows, with the question it answers."""

VALIDATED_GLOBAL = "validated_global.safetensors"
"""The file in a site's state folder that holds the global weights of its last validation, as
the server sent them: the next round's training (carried by the same validation message, or by a
training message of its own) and the finishing message rebuild their weights from it."""

State = dict[str, torch.Tensor]

_SITES: dict[tuple[str, str], SiteData] = {}  # a ClientApp process may serve many messages


def _setting(node_config: dict[str, Any], key: str) -> str | None:
    value = node_config.get(key)
    return None if value is None or str(value) == "" else str(value)


def node_site(node_config: dict[str, Any]) -> SiteData:
    """The site this SuperNode serves, loaded (through its cache) from ``manifest``."""
    manifest = _setting(node_config, "manifest")
    if manifest is None:
        raise ConfigError(
            "this SuperNode has no site manifest: start it with "
            '--node-config \'manifest="/path/to/site.toml" state-dir="/path/to/state"\''
        )
    cache_dir = _setting(node_config, "cache-dir")
    key = (manifest, cache_dir or "")
    if key not in _SITES:
        cache = TensorCache(Path(cache_dir) if cache_dir else default_cache_dir())
        _SITES[key] = load_site(load_manifest(manifest), cache)
    return _SITES[key]


def node_encoded(node_config: dict[str, Any], run: RunSettings) -> SiteData:
    """The site as the run trains on it: in the frozen-encoder mode, its photos' features
    under this node's own copy of the encoder's weights (--init), which must be torchvision's
    published file (its bytes match the hash in its name), cached beside the photos."""
    site = node_site(node_config)
    if not run.config.frozen_encoder:
        return site
    check = torchvision_hash_check(resolve_init(run.config.init).file)
    if not check.startswith(HASH_MATCHES):
        raise ConfigError(
            f"--frozen-encoder: this SuperNode's weights for --init {run.config.init} are not "
            f"torchvision's published file ({check or 'no hash in its name'}); every site must "
            "encode with the same file: copy torchvision's file to this machine"
        )
    cache_dir = _setting(node_config, "cache-dir")
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    return frozen_features([site], run.config, folder)[0]


def describe(node_config: dict[str, Any]) -> dict[str, Any]:
    """What the server may know of this site (no scans)."""
    return asdict(SiteInfo.of(node_site(node_config)))


@dataclass
class RunSettings:
    """The run as the server describes it in every message."""

    name: str
    config: TrainConfig
    spec: ModelSpec
    sites: list[str]
    init_sha256: str = ""  # hash of the starting weights the server sends (--init); "": none
    # The run's plan as the sites approve it (medfed.governance.plan), checked by each site's
    # gate against its policy before the message goes further.
    plan: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "train": self.config.to_dict(),
            "spec": self.spec.to_dict(),
            "sites": self.sites,
            "init_sha256": self.init_sha256,
            "plan": self.plan,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSettings:
        return cls(
            name=str(data["name"]),
            config=TrainConfig.from_dict(data["train"], where="run settings"),
            spec=ModelSpec.from_dict(data["spec"]),
            sites=[str(s) for s in data["sites"]],
            init_sha256=str(data.get("init_sha256") or ""),
            plan=data.get("plan"),
        )


def train_config_from_toml(text: str, where: str) -> TrainConfig:
    """A TrainConfig from TOML text: a ``[train]`` table (as in a run's config.toml) or keys."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    train = data.get("train", data)
    if not isinstance(train, dict):
        raise ConfigError(f"{where}: 'train' must be a [train] table of training settings")
    return TrainConfig.from_dict(train, where=where)


class SiteNode:
    """One site inside one run: builds its worker and keeps its state on the node's disk."""

    def __init__(
        self, node_config: dict[str, Any], run: RunSettings, init: State | None = None
    ) -> None:
        self.run = run
        self.data = normalized([node_encoded(node_config, run)], run.config)[0]
        if self.data.id not in run.sites:
            raise ConfigError(
                f"this SuperNode serves site {self.data.id!r}, which run {run.name!r} does not "
                f"list (its sites: {run.sites}); check the manifest in --node-config"
            )
        self.index = run.sites.index(self.data.id)
        state_dir = _setting(node_config, "state-dir") or os.path.expanduser("~/.medfed/node")
        self.dir = Path(state_dir) / _safe(run.name) / _safe(self.data.id)
        self.algorithm = settled_algorithm(run.config)  # as the plan built it
        self.setup = resolve_device(_setting(node_config, "device") or run.config.device)
        # One round more than the server keeps: a node may have finished a round the server
        # never checkpointed, and a resumed run asks for the round before it.
        self.store = CheckpointStore(self.dir, run.config.keep_checkpoints + 1)
        if init is not None:
            self.keep_init(init)

    @property
    def init_path(self) -> Path:
        return self.dir / "init.safetensors"

    def keep_init(self, init: State) -> None:
        """Store the starting weights the server sent, once their hash is the run's."""
        if not self.run.init_sha256:
            raise ConfigError("the server sent starting weights to a run that names none")
        got = state_sha256(init)
        if got != self.run.init_sha256:
            raise ConfigError(
                f"the starting weights arrived with sha256 {got}, not the run's "
                f"{self.run.init_sha256}: they were changed on the way; start the run again"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        save_state(self.init_path, init)

    def starting_weights(self) -> State:
        """The run's starting weights as this node stored them (their hash checked again)."""
        fix = "restart the run so that the server sends them again"
        if not self.init_path.is_file():
            raise RunDirError(f"{self.init_path}: the run's starting weights never arrived; {fix}")
        init = load_state(self.init_path, fix)
        if state_sha256(init) != self.run.init_sha256:
            raise RunDirError(
                f"{self.init_path}: not the run's starting weights (sha256 differs); delete "
                f"it and {fix}"
            )
        return init

    def worker(self, upto_round: int) -> SiteWorker:
        """This site as it stood after the last round it finished, up to ``upto_round``."""
        model = initial_model(self.run.spec, self.algorithm, self.run.config.seed, self.setup)
        if self.run.init_sha256:
            start = self.starting_weights()
            model.load_state_dict({**model.state_dict(), **start})
        init = clone_state(model.state_dict())
        shared = self.algorithm.shared_keys(model) if self.algorithm.communicates else []
        worker = SiteWorker(
            data=self.data,
            index=self.index,
            n_sites=len(self.run.sites),
            algorithm=self.algorithm,
            config=self.worker_config(),
            model=model,
            setup=self.setup,
            state=init,
            extra=self.algorithm.init_extra(model),
            held={k: init[k].cpu().clone() for k in shared},
            secret=self.noise_secret(),
        )
        saved = self.store.latest(upto_round)
        if saved is not None:
            states, _ = self.store.load(saved)
            if "state" not in states:  # a checkpoint written before folders listed their files
                raise RunDirError(
                    f"{saved}/state.safetensors: missing, so this site cannot resume; delete "
                    f"{saved} to resume from the checkpoint before it, or start the run again"
                )
            device = self.setup.device
            worker.state = {k: v.to(device) for k, v in states["state"].items()}
            worker.extra = {k: v.to(device) for k, v in states.get("extra", {}).items()}
            worker.held.update(states.get("held", {}))
        return worker

    def held_matching(
        self, worker: SiteWorker, upto_round: int, keys: list[str], sha256: str
    ) -> State:
        """The global state (of ``keys``) this site held when the server computed its delta
        downlink, whose reference hash is ``sha256``: what it holds now, or, when the server
        never took its last reply, what it held after an earlier round (its checkpoints, then
        the start). Only the reference goes back: the site's weights and its privacy
        accounting stay."""

        def fits(held: State) -> bool:
            return set(keys) <= set(held) and state_sha256({k: held[k] for k in keys}) == sha256

        if fits(worker.held):
            return {k: worker.held[k] for k in keys}
        for round_, folder in reversed(self.store.rounds()):
            if round_ < upto_round:
                held = self.store.load(folder)[0].get("held", {})
                if fits(held):
                    return {k: held[k] for k in keys}
        start = self.worker(0).held
        if fits(start):
            return {k: start[k] for k in keys}
        raise RunDirError(
            f"{self.dir}: this site holds no copy of the global state the server's delta "
            f"downlink was computed against (sha256 {sha256}); it sits this round out, and "
            "its checkpoints of the last rounds are needed to rejoin (keep_checkpoints)"
        )

    def worker_config(self) -> TrainConfig:
        """The run's settings as this node trains them: under a privacy budget with no noise
        given, the noise that budget allows, searched once and kept in the node's state folder
        (the search takes seconds, and every message starts a fresh process)."""
        config = self.run.config
        if not config.dp.enabled or config.dp_noise:
            return config
        n_train = int(self.data.y[Split.TRAIN].shape[0])
        steps = planned_dp_steps(config, self.algorithm)
        question = {
            "epsilon": config.dp_epsilon,
            "delta": config.dp.delta_for(n_train),
            "rate": min(1.0, config.batch_size / n_train),
            "steps": steps,
            "accountant": config.dp_accountant,
        }
        path = self.dir / PLANNED_NOISE
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = None
        noise = saved.get("noise") if isinstance(saved, dict) else None
        if saved is None or saved.get("question") != question or not isinstance(noise, float):
            plan = SitePrivacy.plan(config.dp, self.data.id, n_train, config.batch_size, steps)
            noise = plan.noise
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps({"question": question, "noise": noise}))
        return dataclasses.replace(config, dp_noise=noise)

    @property
    def noise_key_path(self) -> Path:
        return self.dir / NOISE_KEY

    def noise_secret(self) -> int | None:
        """This site's secret seed for DP-SGD's batches and noise, drawn once from the
        operating system and kept on the node only (None: the run is not private)."""
        if not self.run.config.dp.enabled:
            return None
        path = self.noise_key_path
        if not path.is_file():
            self.dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another message's process was first
                handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                with os.fdopen(handle, "wb") as out:
                    out.write(secrets.token_bytes(NOISE_KEY_BYTES))
        key = path.read_bytes()
        if len(key) != NOISE_KEY_BYTES:
            raise RunDirError(
                f"{path}: {len(key)} bytes, not the {NOISE_KEY_BYTES} of a noise key; delete it "
                "(the site then draws a new one) and resume"
            )
        return int.from_bytes(key, "big")

    def keep_validated(self, payload: bytes) -> None:
        """Keep the global weights this site validated (float32, as sent), for the next round."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{VALIDATED_GLOBAL}.tmp"
        tmp.write_bytes(payload)
        os.replace(tmp, self.dir / VALIDATED_GLOBAL)

    def validated_downlink(self, keys: list[str], sha256: str) -> bytes:
        """A training or finishing message's weights that the server did not send again:
        rebuilt from the global weights this site validated last, and checked against their
        hash."""
        path = self.dir / VALIDATED_GLOBAL
        why = (
            "the server sends the weights themselves instead: at once to finish, with the next "
            "validation to train (this site sits the round out)"
        )
        try:
            payload = wire.lossless_subset(path.read_bytes(), keys)
        except OSError as exc:
            raise RunDirError(
                f"{path}: this round's weights were to be rebuilt from the global weights "
                f"this site validated last round, but they cannot be read ({exc.strerror}); {why}"
            ) from None
        except wire.WireError as exc:
            raise RunDirError(
                f"{path}: not the weights validated last round ({exc}); {why}"
            ) from None
        if hashlib.sha256(payload).hexdigest() != sha256:
            raise RunDirError(
                f"{path}: the weights this site validated last round are not the ones this "
                f"round trains from (sha256 differs); {why}"
            )
        return payload

    def save(self, round_: int, worker: SiteWorker) -> None:
        """Checkpoint the site after ``round_`` (atomically; older rounds are pruned)."""
        parts = {"state": worker.state, "extra": worker.extra, "held": worker.held}
        self.store.save(round_, {name: state for name, state in parts.items() if state})


def _safe(name: str) -> str:
    """``name`` as one folder name that stays inside its parent: every character outside
    letters, digits, '.', '_' and '-' becomes '_', and a name of dots only ('.', '..'), or
    none, gets a leading '_'."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(name))
    return cleaned if cleaned.strip(".") else "_" + cleaned
