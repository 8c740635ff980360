"""The in-process engine: all sites in one process, rounds of local work and aggregation.

Deterministic on CPU for a given seed: every random draw of round r at site i comes from a
generator seeded by (seed, r, i), so a run resumed from a checkpoint repeats exactly what an
uninterrupted run would have done.
"""

from __future__ import annotations

import math
import time
import tomllib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tomli_w
import torch
from tqdm import tqdm

from medfed import __version__
from medfed.algorithms.base import (
    Algorithm,
    Batches,
    LocalResult,
    LocalTask,
    Optim,
    State,
    supervised_steps,
)
from medfed.config import Fault, Modality, TrainConfig
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.errors import ConfigError, MedfedError
from medfed.evaluation import evaluate, views_of
from medfed.federation import wire
from medfed.federation.device import DeviceSetup, resolve_device
from medfed.federation.validate import validate_update
from medfed.federation.wire import WireFormat
from medfed.inference import SiteEntry, TrainedFederation, fit_abstention, run_model
from medfed.metrics import site_metrics
from medfed.models.fedmodel import FedModel, ModelSpec, build_model
from medfed.runs import RunDir

TIMING_KEYS = ("seconds_per_round", "seconds_total")


class SiteDropped(MedfedError):
    """A site did not deliver a usable update this round."""


def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def cosine_lr(base: float, round_: int, rounds: int) -> float:
    """Cosine decay over rounds, from ``base`` in round 1 toward 0 (as the reference FedDRM)."""
    return 0.5 * base * (1 + math.cos(math.pi * (round_ - 1) / rounds))


def default_backbone(modality: Modality, algorithm: Algorithm) -> str:
    """GroupNorm backbones by default; BatchNorm ones for algorithms built around BN (FedBN).

    With BatchNorm, every training batch holds one site's scans only, so batch statistics wipe
    out exactly the site differences FedDRM's client head has to learn (the reference FedDRM
    code uses GroupNorm for the same reason).
    """
    if modality is Modality.CT:
        return "monai3d" if algorithm.uses_batch_norm else "monai3d-gn"
    return "cnn" if algorithm.uses_batch_norm else "cnn-gn"


def clone_state(state: State) -> State:
    return {k: v.detach().clone() for k, v in state.items()}


@dataclass
class SiteSlot:
    """A site as the engine holds it: its data on the device and its own weights."""

    data: SiteData
    index: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    state: State
    extra: State
    held: State = field(default_factory=dict)  # the global state the site last received
    final_state: State | None = None

    @property
    def id(self) -> str:
        return self.data.id

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])


@dataclass
class RoundOutcome:
    records: list[dict[str, Any]] = field(default_factory=list)
    updates: list[tuple[State, float]] = field(default_factory=list)


class Engine:
    """Train one algorithm over several sites, writing the run directory as it goes."""

    def __init__(
        self,
        sites: list[SiteData],
        algorithm: Algorithm,
        config: TrainConfig,
        run: RunDir,
        *,
        progress: bool = False,
    ) -> None:
        if not sites:
            raise ConfigError("no sites to train on")
        modalities = {s.manifest.modality for s in sites}
        if len(modalities) > 1:
            raise ConfigError(f"all sites must share one modality, got {sorted(modalities)}")
        if config.min_sites > len(sites):
            raise ConfigError(
                f"min_sites={config.min_sites} but only {len(sites)} site(s) were given: "
                "no round could ever aggregate; lower --min-sites"
            )
        label_maps = {s.id: s.manifest.labels for s in sites}
        if len({tuple(sorted(m.items())) for m in label_maps.values()}) > 1:
            raise ConfigError(
                f"sites declare different [labels] {label_maps}; a federation needs one label "
                "map (same class names and indices) at every site"
            )
        shapes = {s.id: tuple(s.x[Split.TRAIN].shape[1:]) for s in sites}
        if len(set(shapes.values())) > 1:
            raise ConfigError(
                f"sites preprocess to different input shapes {shapes}; give every site the "
                "same preprocess image_size (fundus) or shape (CT)"
            )
        bad_rounds = [f for f in config.faults if not 1 <= Fault.parse(f).round <= config.rounds]
        if bad_rounds:
            raise ConfigError(f"fault(s) {bad_rounds} name a round outside 1..{config.rounds}")
        self.algorithm = algorithm
        self.config = config
        self.run = run
        self.progress = progress
        self.setup: DeviceSetup = resolve_device(config.device)
        self.modality = modalities.pop()
        self.spec = ModelSpec(
            backbone=config.backbone
            if config.backbone != "auto"
            else default_backbone(self.modality, algorithm),
            in_channels=int(sites[0].x[Split.TRAIN].shape[1]),
            n_classes=max(s.manifest.n_classes for s in sites),
            n_sites=len(sites),
            client_branch=algorithm.needs_client_branch,
        )
        self.spec = algorithm.adapt_spec(self.spec, [s.id for s in sites])
        torch.manual_seed(derive_seed(config.seed, 0))
        self.model: FedModel = build_model(self.spec).to(self.setup.device)
        if self.setup.is_cuda and self.modality is Modality.FUNDUS:
            self.model = self.model.to(memory_format=torch.channels_last)
        init = clone_state(self.model.state_dict())
        self.shared_keys = algorithm.shared_keys(self.model) if algorithm.communicates else []
        self.global_state: State = {k: init[k].clone() for k in self.shared_keys}
        self.wire = WireFormat(config.wire_precision, config.wire_delta)
        self.slots = [
            SiteSlot(
                data=s,
                index=i,
                x_train=self.setup.put(s.x[Split.TRAIN]),
                y_train=self.setup.put(s.y[Split.TRAIN]),
                state=clone_state(init),
                extra=algorithm.init_extra(self.model),
                held={k: v.cpu().clone() for k, v in self.global_state.items()},
            )
            for i, s in enumerate(sites)
        ]
        total = sum(slot.n_train for slot in self.slots)
        self.priors = np.array([slot.n_train / total for slot in self.slots])
        self.faults = config.fault_plan
        unknown = {site for _, site in self.faults} - {slot.id for slot in self.slots}
        if unknown:
            raise ConfigError(f"fault plan names unknown site(s) {sorted(unknown)}")

    # ------------------------------------------------------------------ config and resume
    def resolved_config(self) -> dict[str, Any]:
        return {
            "medfed_version": __version__,
            "train": self.config.to_dict(),
            "model": self.spec.to_dict(),
            "sites": [slot.data.manifest.to_dict() for slot in self.slots],
        }

    def _start_round(self, resume: bool) -> int:
        config = self.resolved_config()
        if not resume:
            if self.run.config_path.exists():
                raise ConfigError(
                    f"{self.run.path} already holds a run; pass --resume to continue it "
                    "or choose another --out"
                )
            self.run.path.mkdir(parents=True, exist_ok=True)
            self.run.write_config(config)
            self.run.log_event("start", device=self.setup.describe())
            return 1
        if not self.run.config_path.exists():
            raise ConfigError(f"--resume: {self.run.path} holds no run to resume")
        previous = self.run.read_config()
        config = tomllib.loads(tomli_w.dumps(config))  # as stored: tuples become lists
        if previous.get("train") != config["train"] or previous.get("sites") != config["sites"]:
            raise ConfigError(
                f"--resume: the settings differ from the run in {self.run.path} "
                "(config.toml); resume with the same sites and options"
            )
        checkpoints = self.run.list_checkpoints()
        if not checkpoints:
            self.run.truncate_metrics(0)
            self.run.log_event("resume", from_round=0)
            return 1
        states, meta = self.run.load_checkpoint(checkpoints[-1])
        self.global_state = {k: v.to(self.setup.device) for k, v in states["global"].items()}
        for slot in self.slots:
            slot.state = {k: v.to(self.setup.device) for k, v in states[f"site_{slot.id}"].items()}
            extra = states.get(f"extra_{slot.id}", {})
            slot.extra = {k: v.to(self.setup.device) for k, v in extra.items()}
            slot.held = states.get(f"held_{slot.id}", slot.held)
        done = int(meta["round"])
        self.run.truncate_metrics(done)
        self.run.log_event("resume", from_round=done)
        return done + 1

    def _checkpoint(self, round_: int) -> None:
        states: dict[str, State] = {"global": self.global_state}
        for slot in self.slots:
            states[f"site_{slot.id}"] = slot.state
            if slot.extra:
                states[f"extra_{slot.id}"] = slot.extra
            if self.wire.delta:
                states[f"held_{slot.id}"] = slot.held
        self.run.save_checkpoint(round_, states, {}, keep=self.config.keep_checkpoints)

    # ------------------------------------------------------------------ one round
    def _sample(self, round_: int) -> set[int]:
        k = len(self.slots)
        m = max(self.config.min_sites, math.ceil(self.config.client_fraction * k))
        if m >= k:
            return set(range(k))
        rng = np.random.default_rng(derive_seed(self.config.seed, round_, 1_000_003))
        return set(rng.choice(k, size=m, replace=False).tolist())

    def _task(
        self, slot: SiteSlot, round_: int, lr: float, global_in: State, *, limited: bool = True
    ) -> LocalTask:
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, round_, slot.index))
        fault = self.faults.get((round_, slot.id))
        deadline = (
            time.monotonic() + self.config.site_timeout_s
            if self.config.site_timeout_s and limited
            else math.inf
        )
        if fault == "timeout":
            deadline = -math.inf

        def check_deadline() -> None:
            if time.monotonic() > deadline:
                raise SiteDropped(
                    f"site {slot.id!r} exceeded its local time limit "
                    f"({self.config.site_timeout_s:g} s)"
                )

        return LocalTask(
            model=self.model,
            global_state=global_in,
            batches=Batches(
                slot.x_train,
                slot.y_train,
                self.config.batch_size,
                generator,
                augment_flip=self.config.augment and self.modality is Modality.FUNDUS,
            ),
            steps=self.config.local_steps,
            optim=Optim(lr, self.config.momentum, self.config.weight_decay, self.config.optimizer),
            site_index=slot.index,
            n_sites=len(self.slots),
            site_id=slot.id,
            extra=clone_state(slot.extra),
            autocast=self.setup.autocast(),
            check_deadline=check_deadline,
        )

    def _local(
        self, slot: SiteSlot, round_: int, lr: float, global_in: State, keys: list[str]
    ) -> tuple[State, State, State, LocalResult]:
        fault = self.faults.get((round_, slot.id))
        if fault == "drop":
            raise SiteDropped(f"site {slot.id!r} did not answer this round")
        self.model.load_state_dict(slot.state)
        self._select_adapter(slot)
        if global_in:
            self.model.load_state_dict(global_in, strict=False)
        task = self._task(slot, round_, lr, global_in)
        if fault == "raise":
            raise RuntimeError(f"site {slot.id!r} failed during local training (injected)")
        result = self.algorithm.local_train(task)
        if not math.isfinite(result.loss):
            raise SiteDropped(f"site {slot.id!r}: training loss became {result.loss}")
        new_state = clone_state(self.model.state_dict())
        update = {k: new_state[k] for k in keys}
        if fault == "nan" and update:
            key = next(k for k, v in update.items() if v.is_floating_point())
            update[key] = torch.full_like(update[key], float("nan"))
        if fault == "shape" and update:
            key = next(iter(update))
            update[key] = torch.zeros(update[key].numel() + 1, dtype=update[key].dtype)
        return new_state, update, task.extra, result

    def _downlink(
        self, slot: SiteSlot, outgoing: State, shared_payload: bytes
    ) -> tuple[bytes, State]:
        """What the server sends this site, and the global state the site rebuilds from it.

        With delta encoding each site gets the difference to the global state it already holds
        (tracked per site, so quantization errors never accumulate); otherwise one payload
        serves every site.
        """
        if not outgoing:
            return b"", {}
        payload = shared_payload
        held = {k: slot.held[k] for k in outgoing} if self.wire.delta else None
        if self.wire.delta:
            payload = wire.encode(outgoing, self.wire, reference=held)
        return payload, wire.decode(payload, reference=held, dtypes=outgoing)

    def _run_round(self, round_: int, bar: tqdm | None) -> RoundOutcome:
        lr = cosine_lr(self.config.lr, round_, self.config.rounds)
        sampled = self._sample(round_)
        keys = (
            self.algorithm.round_keys(self.model, round_, self.config.rounds)
            if self.shared_keys
            else []
        )
        outgoing = {k: self.global_state[k] for k in keys}
        shared_payload = wire.encode(outgoing, self.wire) if keys and not self.wire.delta else b""
        dtypes = {k: v.cpu() for k, v in outgoing.items()}
        outcome = RoundOutcome()
        for slot in self.slots:
            record: dict[str, Any] = {"round": round_, "site": slot.id, "lr": lr}
            if slot.index not in sampled:
                outcome.records.append(record | {"status": "not_sampled"})
                continue
            start = time.perf_counter()
            try:
                payload_down, held = self._downlink(slot, outgoing, shared_payload)
                global_in = {k: v.to(self.setup.device) for k, v in held.items()}
                new_state, update, extra, result = self._local(slot, round_, lr, global_in, keys)
                payload_up, received = b"", {}
                if keys:
                    reference = held if self.wire.delta else None
                    payload_up = wire.encode(update, self.wire, reference=reference)
                    received = wire.decode(payload_up, reference=reference, dtypes=dtypes)
                    validate_update(slot.id, received, dtypes)
            except Exception as exc:  # any failure of one site drops that site, not the run
                reason = (
                    str(exc) if isinstance(exc, MedfedError) else f"{type(exc).__name__}: {exc}"
                )
                record |= {"status": "dropped", "reason": reason}
                self.run.log_event("dropout", round=round_, site=slot.id, reason=reason)
            else:
                slot.state, slot.extra = new_state, extra
                if self.wire.delta:
                    slot.held.update(held)
                if received:
                    outcome.updates.append((received, float(slot.n_train)))
                record |= {
                    "status": "ok",
                    "train_loss": result.loss,
                    **{f"train_{k}": v for k, v in result.metrics.items()},
                    "bytes_up": len(payload_up),
                    "bytes_down": len(payload_down),
                    "keys_sent": len(keys),
                }
            record["seconds"] = time.perf_counter() - start
            outcome.records.append(record)
            if bar is not None:
                bar.set_postfix_str(f"site {slot.id}")
        return outcome

    def _aggregate(self, round_: int, outcome: RoundOutcome) -> bool:
        if not self.shared_keys:
            return True
        ok = len(outcome.updates)
        if ok < self.config.min_sites:
            self.run.log_event(
                "round_skipped",
                round=round_,
                reason=f"{ok} usable update(s), fewer than min_sites={self.config.min_sites}",
            )
            return False
        aggregated = self.algorithm.aggregate(outcome.updates)
        # A schedule (FedALS) may aggregate only part of the shared keys this round.
        self.global_state.update({k: v.to(self.setup.device) for k, v in aggregated.items()})
        return True

    # ------------------------------------------------------------------ evaluation
    def eval_state(self, slot: SiteSlot) -> State:
        if slot.final_state is not None:
            return slot.final_state
        composed = dict(slot.state)
        composed.update(self.global_state)
        return self.algorithm.eval_state(composed, slot.extra)

    def _select_adapter(self, slot: SiteSlot) -> None:
        if self.spec.lora_adapters:
            self.model.select_adapter(self.model.adapter_for(slot.id))

    def _val_outputs(self, slot: SiteSlot) -> tuple[np.ndarray, np.ndarray | None]:
        """Class probabilities and client logits of a site's model on its validation split."""
        self.model.load_state_dict(self.eval_state(slot))
        self._select_adapter(slot)
        probs, client, _ = run_model(self.model, slot.data.x[Split.VAL], self.setup, heads=None)
        return probs, client

    def _validate_round(self, outcome: RoundOutcome) -> None:
        by_site = {r["site"]: r for r in outcome.records}
        for slot in self.slots:
            y = slot.data.y[Split.VAL].numpy()
            if y.size == 0:
                continue
            probs, client = self._val_outputs(slot)
            figures = site_metrics(y, probs, split="val")
            record = by_site[slot.id]
            record |= {
                "val_auc": figures.auc,
                "val_accuracy": figures.accuracy,
                "val_loss": float(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1)).mean()),
            }
            if client is not None:
                record["val_client_accuracy"] = float((client.argmax(axis=1) == slot.index).mean())

    def _finetune(self) -> None:
        steps = self.algorithm.finetune_steps(self.config.local_steps)
        if steps <= 0:
            return
        # A tenth of the initial rate: the cosine schedule is near 0 by the last round, and the
        # full rate on a site's few, class-imbalanced scans pulls the head to the class prior.
        lr = 0.1 * self.config.lr
        for slot in self.slots:
            self.model.load_state_dict(self.eval_state(slot))
            self._select_adapter(slot)
            # Fine-tuning happens on the site after the federation is done: no round deadline.
            task = self._task(slot, self.config.rounds + 1, lr, {}, limited=False)
            supervised_steps(task, self.model, self.model.parameters(), self.algorithm.loss, steps)
            slot.final_state = clone_state(self.model.state_dict())

    def trained_federation(self) -> TrainedFederation:
        """The final per-site models, with abstention calibrated on the validation splits."""
        sites = [
            SiteEntry(
                id=slot.id,
                index=slot.index,
                prior=float(self.priors[slot.index]),
                normalization=slot.data.normalization,
                manifest=slot.data.manifest,
            )
            for slot in self.slots
        ]
        states = [{k: v.cpu() for k, v in self.eval_state(s).items()} for s in self.slots]
        fed = TrainedFederation(self.spec, self.algorithm.name, sites, states, self.setup)
        data = [slot.data for slot in self.slots]
        fed.abstention = fit_abstention(
            fed,
            [d.x[Split.TRAIN] for d in data],
            [views_of(data, origin, Split.VAL) for origin in data],
        )
        return fed

    # ------------------------------------------------------------------ the whole run
    def train(self, *, resume: bool = False) -> dict[str, Any]:
        first = self._start_round(resume)
        rounds = range(first, self.config.rounds + 1)
        bar = tqdm(
            rounds, desc=f"{self.algorithm.name} rounds", disable=not self.progress, leave=False
        )
        for round_ in bar:
            start = time.perf_counter()
            outcome = self._run_round(round_, bar)
            aggregated = self._aggregate(round_, outcome)
            seconds = time.perf_counter() - start
            for record in outcome.records:
                record["round_seconds"] = seconds
                record["aggregated"] = aggregated
            self._validate_round(outcome)
            self.run.append_metrics(outcome.records)
            self._checkpoint(round_)
        self._finetune()
        fed = self.trained_federation()
        summary = self._summary(fed)
        self.run.write_summary(summary)
        fed.save(self.run, {"n_train": {s.id: s.n_train for s in self.slots}})
        self.run.log_event("finish", rounds=self.config.rounds)
        return summary

    def _summary(self, fed: TrainedFederation) -> dict[str, Any]:
        metrics = self.run.read_metrics()
        per_round: dict[int, dict[str, float]] = {}
        for r in metrics:
            agg = per_round.setdefault(r["round"], {"bytes": 0, "seconds": r.get("round_seconds")})
            agg["bytes"] += r.get("bytes_up", 0) + r.get("bytes_down", 0)
        dropped = [
            {"round": r["round"], "site": r["site"], "reason": r.get("reason", "")}
            for r in metrics
            if r.get("status") == "dropped"
        ]
        seconds = [v["seconds"] for v in per_round.values() if v["seconds"] is not None]
        rounds = max(1, len(per_round))
        traffic = {
            slot.id: {
                direction: sum(
                    r.get(f"bytes_{direction}", 0) for r in metrics if r["site"] == slot.id
                )
                / rounds
                for direction in ("up", "down")
            }
            for slot in self.slots
        }
        return {
            "algorithm": self.algorithm.name,
            "params": dict(self.algorithm.params.__dict__),
            "rounds": self.config.rounds,
            "local_steps": self.config.local_steps,
            "seed": self.config.seed,
            "backbone": self.spec.backbone,
            "modality": str(self.modality),
            "device": self.setup.describe(),
            **evaluate(fed, [slot.data for slot in self.slots]),
            "priors": {s.id: float(p) for s, p in zip(self.slots, self.priors, strict=True)},
            "bytes_per_round": float(np.mean([v["bytes"] for v in per_round.values()]))
            if per_round
            else 0.0,
            "bytes_per_round_by_site": traffic,
            "wire": {"precision": self.wire.precision, "delta": self.wire.delta},
            "seconds_per_round": float(np.mean(seconds)) if seconds else None,
            "seconds_total": float(np.sum(seconds)) if seconds else None,
            "dropouts": len(dropped),
            "dropped": dropped,
            "skipped_rounds": sorted({r["round"] for r in metrics if r.get("aggregated") is False}),
            "resumes": sum(1 for e in self.run.read_events() if e.get("event") == "resume"),
        }
