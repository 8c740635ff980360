"""A site's side of a federation: its data, its weights, its private state, its local work.

The in-process engine holds one :class:`SiteWorker` per site; a Flower SuperNode holds one for
its own site. Both run the same code, so the same seed and sites give the same figures.

Every random draw of round r at site i comes from a generator seeded by (seed, r, i).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from medfed.algorithms.base import (
    Algorithm,
    Batches,
    LocalResult,
    LocalTask,
    Optim,
    State,
    supervised_steps,
)
from medfed.algorithms.privacy import (
    BudgetSpent,
    SitePrivacy,
    count_steps,
    mark_stopped,
    steps_taken,
    stopped_round,
)
from medfed.config import Modality, TrainConfig
from medfed.core.errors import ConfigError, MedfedError
from medfed.data.modality import modality_spec
from medfed.data.records import Split
from medfed.data.sitedata import SiteData
from medfed.federation import wire
from medfed.federation.shared import clone_state, derive_seed
from medfed.federation.wire import WireFormat
from medfed.metrics import OperatingRule, choose_threshold, site_metrics
from medfed.models.compiling import compile_for_training
from medfed.models.device import DeviceSetup, keep_freed_memory
from medfed.models.fedmodel import FedModel
from medfed.models.forward import run_model
from medfed.models.precision import training_precision
from medfed.routing.abstention import FeatureGaussian, site_gaussian
from medfed.routing.bundle import OperatingChoice, SiteEntry
from medfed.runs.schema import PrivacySpent


class SiteDropped(MedfedError):
    """A site did not deliver a usable update this round."""


def failure_reason(exc: BaseException) -> str:
    """A site's failure in one line: medfed's own message, or the exception type and text."""
    return str(exc) if isinstance(exc, MedfedError) else f"{type(exc).__name__}: {exc}"


def finetune_lr(config: TrainConfig) -> float:
    # A tenth of the initial rate: the cosine schedule is near 0 by the last round, and the
    # full rate on a site's few, class-imbalanced scans pulls the head to the class prior.
    return 0.1 * config.lr


def planned_dp_steps(config: TrainConfig, algorithm: Algorithm) -> int:
    """The DP-SGD steps a site takes over the whole run if it trains every round: the rounds'
    local steps and the fine-tuning after them (what the noise is planned for)."""
    local = config.local_steps
    return config.rounds * algorithm.steps_per_round(local) + algorithm.finetune_steps(local)


def private_batch_norms(model: nn.Module, private: set[str]) -> list[_BatchNorm]:
    """The BatchNorm layers whose running statistics stay on the site (FedBN, FedDRM)."""
    return [
        module
        for name, module in model.named_modules()
        if isinstance(module, _BatchNorm)
        and module.track_running_stats
        and f"{name}.running_mean" in private
    ]


@torch.no_grad()
def recompute_batch_norm_stats(
    model: nn.Module, layers: list[_BatchNorm], x: torch.Tensor, batch_size: int
) -> None:
    """Running statistics of ``layers`` measured afresh on ``x`` with the model's final weights.

    The statistics a site accumulated while training belong to its weights before the last
    averaging; the weights it answers with are the averaged ones. Every batch of ``x`` counts
    equally (cumulative average); the rest of the model stays in eval mode.
    """
    model.eval()
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None
        layer.train()
    try:
        for start in range(0, int(x.shape[0]), batch_size):
            model(x[start : start + batch_size])
    finally:
        for layer, momentum in zip(layers, momenta, strict=True):
            layer.momentum = momentum
            layer.eval()


@dataclass
class LocalRound:
    """What one round of local work produced, before the site keeps it."""

    payload_up: bytes
    state: State
    extra: State
    held: State
    result: LocalResult


@dataclass
class Published:
    """A site's final model, as it publishes it after the last round."""

    entry: SiteEntry
    n_train: int
    state: State
    gaussian: FeatureGaussian
    privacy: PrivacySpent | None = None


@dataclass
class SiteWorker:
    """One site's weights and private state, and the work it does on them.

    ``model`` is scratch space: the in-process engine shares one model between its workers and
    loads a site's weights into it before each piece of work.
    """

    data: SiteData
    index: int
    n_sites: int
    algorithm: Algorithm
    config: TrainConfig
    model: FedModel
    setup: DeviceSetup
    state: State
    extra: State
    held: State = field(default_factory=dict)  # the global state this site last received
    final_state: State | None = None
    # Under differential privacy on a real deployment: the site's own secret, which seeds its
    # batches and its noise in place of the run's seed (the server knows that seed, and noise
    # it could draw again would protect nothing). None: the run's seed (in one process).
    secret: int | None = None

    def __post_init__(self) -> None:
        if not self.setup.is_cuda:
            keep_freed_memory()
        # A NormalizedView: the stored split (moved to the GPU once, in its storage dtype),
        # normalized batch by batch as training reads it.
        self.x_train = self.setup.put(self.data.x[Split.TRAIN])
        self.y_train = self.setup.put(self.data.y[Split.TRAIN])
        self.wire = WireFormat(self.config.wire_precision, self.config.wire_delta)
        private = self.config.dp.enabled
        self.precision = training_precision(self.setup, self.config.precision, private=private)
        # fp16's loss scale carries from round to round (a fresh one would start high and skip
        # the first steps of every round); it is not checkpointed and starts again on resume.
        self.scaler = self.precision.scaler()
        self.compile_note: str | None = None  # None: not tried yet; "": compiled
        self.privacy: SitePrivacy | None = None
        if self.config.dp.enabled:
            planned = planned_dp_steps(self.config, self.algorithm)
            self.privacy = SitePrivacy.plan(
                self.config.dp, self.id, self.n_train, self.config.batch_size, planned
            )
            first = self.algorithm.steps_per_round(self.config.local_steps)
            if not self.privacy.affordable(first):
                raise ConfigError(
                    f"site {self.id!r}: its first round alone would spend epsilon "
                    f"{self.privacy.epsilon(first):.2f}, past its budget (--dp-epsilon "
                    f"{self.config.dp_epsilon:g}) at noise multiplier {self.privacy.noise:g} "
                    "(--dp-noise); raise --dp-noise or the budget, or leave --dp-noise out to "
                    "have it set from the budget"
                )

    @property
    def id(self) -> str:
        return self.data.id

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def modality(self) -> Modality:
        return self.data.manifest.modality

    # ------------------------------------------------------------------ local training
    def task(
        self,
        round_: int,
        lr: float,
        global_in: State,
        *,
        fault: str | None = None,
        limited: bool = True,
    ) -> LocalTask:
        private = self.secret is not None and self.privacy is not None
        base = self.secret if private else self.config.seed
        generator = torch.Generator().manual_seed(derive_seed(base, round_, self.index))
        timeout = self.config.site_timeout_s
        deadline = time.monotonic() + timeout if timeout and limited else math.inf
        if fault == "timeout":
            deadline = -math.inf

        def check_deadline() -> None:
            if time.monotonic() > deadline:
                raise SiteDropped(f"site {self.id!r} exceeded its local time limit ({timeout:g} s)")

        return LocalTask(
            model=self.model,
            global_state=global_in,
            batches=Batches(
                self.x_train,
                self.y_train,
                self.config.batch_size,
                generator,
                augment_flip=self.flips,
                channels_last=self.setup.channels_last,
            ),
            steps=self.config.local_steps,
            optim=Optim(lr, self.config.momentum, self.config.weight_decay, self.config.optimizer),
            site_index=self.index,
            n_sites=self.n_sites,
            site_id=self.id,
            extra=clone_state(self.extra),
            autocast=self.precision.autocast(),
            check_deadline=check_deadline,
            privacy=self.privacy,
            scaler=self.scaler,
        )

    def receive(self, payload: bytes, dtypes: State) -> State:
        """The global state this site rebuilds from the server's payload."""
        if not payload:
            return {}
        held = {k: self.held[k] for k in dtypes} if self.wire.delta else None
        return wire.decode(payload, reference=held, dtypes=dtypes)

    def train_round(
        self,
        round_: int,
        lr: float,
        payload_down: bytes,
        keys: list[str],
        dtypes: State,
        fault: str | None = None,
    ) -> LocalRound:
        """Decode the server's payload, train locally, encode the update of ``keys``.

        Nothing changes on the site until :meth:`keep` is called with the result.
        """
        if fault == "drop":
            raise SiteDropped(f"site {self.id!r} did not answer this round")
        received = self.receive(payload_down, dtypes)
        global_in = {k: v.to(self.setup.device) for k, v in received.items()}
        self.load(self.state, global_in)
        task = self.task(round_, lr, global_in, fault=fault)
        if fault == "raise":
            raise RuntimeError(f"site {self.id!r} failed during local training (injected)")
        if self.privacy is not None:  # a round that would overspend is not started
            steps = self.algorithm.steps_per_round(self.config.local_steps)
            try:
                self.privacy.check_affordable(steps_taken(self.extra), steps)
            except BudgetSpent:
                mark_stopped(self.extra, round_)
                raise
        if self.config.compile and self.compile_note is None:
            sample = self.sample_batch()
            self.compile_note = compile_for_training(
                self.model, sample, task.autocast, private=self.privacy is not None
            )
        result = self.algorithm.local_train(task)
        if self.scaler is not None:  # fp16: where the loss scale stands (a fall: skipped steps)
            result.metrics["loss_scale"] = float(self.scaler.get_scale())
        if self.config.compile:
            result.metrics["compiled"] = float(not self.compile_note)
        if self.privacy is not None:
            # Spent once the update leaves, whether or not the server then takes it.
            spent = steps_taken(task.extra)
            count_steps(self.extra, spent)
            result.metrics["dp_epsilon"] = self.privacy.epsilon(spent)
            result.metrics["dp_steps"] = float(spent)
        if not math.isfinite(result.loss):
            raise SiteDropped(f"site {self.id!r}: training loss became {result.loss}")
        new_state = clone_state(self.model.state_dict())
        update = {k: new_state[k] for k in keys}
        if fault == "nan" and update:
            key = next(k for k, v in update.items() if v.is_floating_point())
            update[key] = torch.full_like(update[key], float("nan"))
        if fault == "shape" and update:
            key = next(iter(update))
            update[key] = torch.zeros(update[key].numel() + 1, dtype=update[key].dtype)
        payload_up = b""
        if keys:
            reference = received if self.wire.delta else None
            payload_up = wire.encode(update, self.wire, reference=reference)
        held = {k: v.cpu() for k, v in received.items()} if self.wire.delta else {}
        return LocalRound(payload_up, new_state, task.extra, held, result)

    def sample_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first training scans, a batch's worth, drawing nothing from the seeded
        generator (compiling on them leaves the run's batches as they were)."""
        index = torch.arange(min(self.config.batch_size, self.n_train))
        x = self.x_train[index.to(self.x_train.device)]
        if self.setup.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, self.y_train[index.to(self.y_train.device)]

    def keep(self, done: LocalRound) -> None:
        """Make a round's result the site's own."""
        self.state, self.extra = done.state, done.extra
        self.held.update(done.held)

    # ------------------------------------------------------------------ answering
    def load(self, state: State, global_state: State | None = None) -> None:
        self.model.load_state_dict(state)
        if self.model.spec.lora_adapters:
            self.model.select_adapter(self.model.adapter_for(self.id))
        if global_state:
            self.model.load_state_dict(global_state, strict=False)

    def eval_state(self, global_state: State) -> State:
        """The weights this site answers with, given the current global state."""
        if self.final_state is not None:
            return self.final_state
        composed = dict(self.state)
        composed.update(global_state)
        return self.algorithm.eval_state(composed, self.extra)

    @property
    def flips(self) -> bool:
        """Whether training flips scans left-right (set, and right for the modality)."""
        if self.model.spec.frozen_encoder:  # features, not photos: nothing to flip
            return False
        return self.config.augment == "flip" and modality_spec(self.modality).horizontal_flip

    def operating_choice(self) -> OperatingChoice | None:
        """The threshold of the loaded model, chosen on this site's validation split by the
        run's operating-point rule (two-class tasks only; None otherwise)."""
        y = self.data.y[Split.VAL].numpy()
        rule = OperatingRule.parse(self.config.operating_point)
        if len(self.data.manifest.class_names()) != 2:
            return None
        if y.size == 0:
            if rule.kind == "threshold":
                return OperatingChoice(str(rule), float(rule.value), None, 0, 0)
            return OperatingChoice(str(rule), 0.5, "no validation split: threshold 0.5 used", 0, 0)
        probs, _, _ = run_model(self.model, self.data.x[Split.VAL], self.setup, heads=None)
        threshold, note = choose_threshold(y, probs[:, 1], rule)
        n_pos = int((y == 1).sum())
        return OperatingChoice(str(rule), float(threshold), note, n_pos, int(y.size) - n_pos)

    def validate(self, global_state: State) -> dict[str, Any]:
        """Figures of this site's model on its validation split (empty without one)."""
        y = self.data.y[Split.VAL].numpy()
        if y.size == 0:
            return {}
        self.load(self.eval_state(global_state))
        probs, client, _ = run_model(self.model, self.data.x[Split.VAL], self.setup, heads=None)
        figures = site_metrics(y, probs, split="val")
        record = {
            "val_auc": figures.auc,
            "val_accuracy": figures.accuracy,
            "val_loss": float(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1)).mean()),
        }
        if client is not None:
            record["val_client_accuracy"] = float((client.argmax(axis=1) == self.index).mean())
        return record

    def finish(self, global_state: State) -> State:
        """The site's final weights: fine-tuned on its own data where the algorithm asks, and
        its own BatchNorm statistics measured again with those weights on its training split."""
        if self.final_state is None:
            steps = self.algorithm.finetune_steps(self.config.local_steps)
            norms = private_batch_norms(self.model, self.algorithm.private_keys(self.model))
            if steps > 0 or norms:
                self.load(self.eval_state(global_state))
                if steps > 0 and self.fine_tuning_affordable(steps):
                    # Fine-tuning happens on the site after the federation: no deadline.
                    task = self.task(
                        self.config.rounds + 1, finetune_lr(self.config), {}, limited=False
                    )
                    params = self.model.parameters()
                    supervised_steps(task, self.model, params, self.algorithm.loss, steps)
                    if self.privacy is not None:
                        count_steps(self.extra, steps_taken(task.extra))
                if norms:
                    batch = self.config.batch_size
                    recompute_batch_norm_stats(self.model, norms, self.x_train, batch)
                self.final_state = clone_state(self.model.state_dict())
        return {k: v.cpu() for k, v in self.eval_state(global_state).items()}

    def fine_tuning_affordable(self, steps: int) -> bool:
        """Whether the site's privacy budget (if any) leaves room for ``steps`` fine-tuning
        steps; a site that cannot afford them answers with the model it has."""
        if self.privacy is None:
            return True
        if self.privacy.affordable(steps_taken(self.extra) + steps):
            return True
        mark_stopped(self.extra, self.config.rounds + 1)
        return False

    def privacy_spent(self) -> PrivacySpent | None:
        """The privacy this site has spent so far (None: it trains without DP)."""
        if self.privacy is None:
            return None
        spent = self.privacy.to_dict(steps_taken(self.extra), stopped_round(self.extra))
        return PrivacySpent.from_dict(spent)

    def publish(self, global_state: State) -> Published:
        """The final model and the Gaussian of its features on this site's training scans
        (what abstention needs; the scans themselves never leave)."""
        state = self.finish(global_state)
        self.load(state)
        gaussian = site_gaussian(self.model, self.data.x[Split.TRAIN], self.setup, self.id)
        entry = SiteEntry(
            self.id,
            self.index,
            1.0,
            self.data.normalization,
            self.data.manifest,
            self.operating_choice(),
        )
        return Published(entry, self.n_train, state, gaussian, self.privacy_spent())
