"""FedGMI: every site's scans are a mixture of M intrinsic distributions shared by the federation.

- M small VAEs (federated) model the distributions, over a coarse, standardized view of the scan
  (pooled intensities and log detail energy, see :mod:`medfed.models.mixture`), never over the
  backbone's moving features;
- each training scan goes to the distribution with the highest affinity, MAP: its ELBO (the VAE's
  log-likelihood bound) plus the log of the site's mixture coefficient for that distribution;
- one expert head per distribution (on a shared, federated backbone) learns from the scans
  assigned to it;
- a site's mixture coefficients are its share of scans per distribution; they stay on the site
  (a buffer of its model, so the saved model answers with them) and are reported every round as
  ``train_mixture_<m>`` in metrics.jsonl;
- the server starts the VAEs apart: of ``candidates`` random VAEs it greedily keeps the M with
  the largest pairwise divergence (data-free), so the first partition does not put every scan in
  one place; a distribution that still ends up empty is split off the largest one (LBG);
- a prediction mixes the experts by the scan's posterior over distributions (``predict=
  posterior``, default) or by the site's coefficients (``predict=coefficients``).

Rounds: round 1 only measures the view's moments (each site's, averaged by the server into the
federation's, which standardize the view from then on); the VAEs travel, and sites re-assign
their scans, in rounds 2, 2+R, 2+2R, ... (R = ``repartition_every``); in between only the
backbone and the experts travel: fewer bytes, staler partitions. With ``weighting=component``
(default) each site also reports, through the update's side channel (``LocalResult.stats``),
how many of its scans each distribution holds, and the server averages VAE m and expert m over
the scans they were trained on (and can split empty ones); ``weighting=site`` keeps those
counts on the site and averages with n_i / N like FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from medfed.algorithms.base import (
    Algorithm,
    Batches,
    LocalResult,
    LocalTask,
    Params,
    State,
    Stats,
    Update,
    optimizer_step,
    weighted_average,
)
from medfed.core.errors import ConfigError
from medfed.models.fedmodel import FedModel, ModelSpec
from medfed.models.mixture import (
    COEFFICIENTS,
    PREDICT_RULES,
    VAE_PREFIX,
    VIEW_STATS,
    VAEBank,
    block_offsets,
    greedy_spread,
    vae_divergence,
)

ASSIGNED = "assigned"  # side-channel statistic: the site's scans per distribution
EXPERT_KEYS = ("target_head.weight", "target_head.bias")
ASSIGNMENT = "assignment"  # extra: each training scan's distribution at the last partition
DECODER_OFFSET = "vaes.dec_b2"
SPLIT_OFFSET = 0.5  # half of each split's offsets, in standard deviations of the view
CANDIDATE_OFFSET = 1.0  # spread of the candidates' offsets, in standard deviations of the view
DIVERGENCE_PROBES = 64
SCORE_BATCH = 256


@dataclass(frozen=True)
class FedGMIParams(Params):
    components: int = 2  # M intrinsic distributions
    latent: int = 2  # latent size of each VAE (small: one VAE must not fit two distributions)
    resolution: int = 8  # view pooled to resolution^2 (images) or (resolution/2)^3 (volumes)
    repartition_every: int = 1  # rounds between re-assignments (the VAEs travel only then)
    predict: str = "posterior"  # or "coefficients"
    candidates: int = 8  # random VAEs the server draws to choose M from
    weighting: str = "component"  # or "site"
    vae_lr: float = 0.01  # Adam learning rate of the VAEs

    def __post_init__(self) -> None:
        if self.components < 2:
            raise ValueError("components must be >= 2 (one distribution is plain FedAvg)")
        if self.latent < 1:
            raise ValueError("latent must be >= 1")
        if self.resolution < 2:
            raise ValueError("resolution must be >= 2")
        if self.repartition_every < 1:
            raise ValueError("repartition_every must be >= 1")
        if self.predict not in PREDICT_RULES:
            raise ValueError(f"predict must be one of {', '.join(PREDICT_RULES)}")
        if self.candidates < self.components:
            raise ValueError("candidates must be >= components")
        if self.weighting not in ("component", "site"):
            raise ValueError("weighting must be component or site")
        if self.vae_lr <= 0:
            raise ValueError("vae_lr must be > 0")


class FedGMI(Algorithm):
    name = "fedgmi"
    summary = "VAE mixture of shared distributions; one expert each; per-site mixture coefficients"
    dp_refusal = (
        "its sites report how many scans fall in each distribution and train VAEs on their own "
        "objective; neither goes through DP-SGD"
    )
    params_class = FedGMIParams

    def adapt_spec(self, spec: ModelSpec, site_ids: list[str]) -> ModelSpec:
        p = self.params
        return replace(
            spec,
            mixture_components=p.components,
            mixture_latent=p.latent,
            mixture_resolution=p.resolution,
            mixture_predict=p.predict,
        )

    def initialize(self, model: FedModel, seed: int) -> None:
        bank = _bank(model)
        self._seed, self._blocks = int(seed), bank.blocks  # for splits in aggregate()
        generator = torch.Generator().manual_seed(int(seed))
        candidates = [
            bank.candidate(generator, CANDIDATE_OFFSET) for _ in range(self.params.candidates)
        ]
        divergence = vae_divergence(bank, candidates, DIVERGENCE_PROBES, generator)
        chosen = [candidates[i] for i in greedy_spread(divergence, bank.components)]
        # Centre the chosen offsets: scans are normalized around zero, so the first partition's
        # boundaries pass through the data rather than beside it.
        centre = torch.stack([c["dec_b2"] for c in chosen]).mean(dim=0)
        for k, values in enumerate(chosen):
            bank.set_component(k, values | {"dec_b2": values["dec_b2"] - centre})

    # --- the sharing rule -------------------------------------------------------------------
    def private_keys(self, model: nn.Module) -> set[str]:
        return {COEFFICIENTS}

    def own_round_keys(self, model: nn.Module, round_: int, rounds: int) -> list[str]:
        if rounds < 2:
            raise ConfigError(
                "fedgmi needs at least 2 rounds: round 1 only measures the view statistics"
            )
        shared = self.shared_keys(model)
        if round_ == 1:  # the view statistics round: only the VAEs (and their moments) travel
            return [k for k in shared if k.startswith(VAE_PREFIX)]
        if is_partition_round(round_, self.params.repartition_every):
            return shared
        return [k for k in shared if not k.startswith(VAE_PREFIX)]

    # --- site-side --------------------------------------------------------------------------
    def local_train(self, task: LocalTask) -> LocalResult:
        model = task.model
        bank = _bank(model)
        n, m = task.batches.x.shape[0], self.params.components
        stored = task.extra.get(ASSIGNMENT)
        if not bank.is_calibrated:
            # Round 1 only measures the view's moments (the server averages them). No expert
            # learns before there is a partition: trained on every scan, all of them would
            # start as the same federation-wide classifier.
            bank.calibrate(task.batches.x)
            result, partition = self._untrained_loss(task), False
        else:
            partition = any(k.startswith(VAE_PREFIX) for k in task.global_state)
            if partition or stored is None or stored.shape[0] != n:
                stored = self._partition(model, task.batches.x)
                task.extra[ASSIGNMENT] = stored
                partition = True
            result = self._steps(task, stored, train_vaes=partition)
            if self.params.weighting == "component":
                counts = torch.bincount(stored.cpu(), minlength=m).float()
                result.stats[ASSIGNED] = counts.tolist()
        coefficients = model.target_head.coefficients.tolist()
        result.metrics |= {f"mixture_{k}": float(c) for k, c in enumerate(coefficients)}
        result.metrics["repartitioned"] = float(partition)
        return result

    @torch.no_grad()
    def _untrained_loss(self, task: LocalTask) -> LocalResult:
        """The experts' mean CE on one minibatch, for the record of a round without training."""
        x, y = task.batches.next()
        model = task.model
        model.eval()
        logits = model.target_head.expert_logits(model.target_branch.body(model.backbone(x)))
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.repeat_interleave(logits.shape[1]))
        return LocalResult(loss=float(ce), metrics={"view_statistics": 1.0})

    def _partition(self, model: FedModel, x: torch.Tensor) -> torch.Tensor:
        """Assign every scan (MAP) and make the shares the site's coefficients."""
        assignment = assign(model, x)
        counts = torch.bincount(assignment.cpu(), minlength=self.params.components).float()
        with torch.no_grad():
            model.target_head.coefficients.copy_(counts / max(1, x.shape[0]))
        return assignment

    def _steps(self, task: LocalTask, assignment: torch.Tensor, train_vaes: bool) -> LocalResult:
        """Local steps: each expert on its scans and, in partition rounds, each VAE too."""
        model = task.model
        bank = _bank(model)
        y = task.batches.y
        batches = Batches(
            task.batches.x,
            torch.stack([y, assignment.to(y.device)], dim=1),  # batches keep scan and label
            task.batches.batch_size,
            task.batches.generator,
            augment_flip=task.batches.augment_flip,
        )
        params = [p for n, p in model.named_parameters() if not n.startswith(VAE_PREFIX)]
        optimizer = task.optim.make(params)
        # The VAEs have their own Adam at a fixed rate: small MLPs on a standardized view learn
        # fast, and partitions made with a VAE that has not yet fit its scans are noise.
        vae_optimizer = torch.optim.Adam(bank.parameters(), lr=self.params.vae_lr)
        model.train()
        expert_total = vae_total = 0.0
        for _ in range(task.steps):
            task.check_deadline()
            x, ya = batches.next()
            with task.autocast():
                loss = expert_loss(model, x, ya[:, 0], ya[:, 1])
            expert_total += float(loss.detach())
            if train_vaes:
                noise = torch.randn(
                    (bank.components, x.shape[0], bank.latent), generator=task.batches.generator
                ).to(x.device)
                vae = vae_loss(bank, x, ya[:, 1], noise)
                vae_total += float(vae.detach())
                loss = loss + vae
            optimizer.zero_grad(set_to_none=True)
            vae_optimizer.zero_grad(set_to_none=True)
            optimizer_step(task, loss, optimizer, *([vae_optimizer] if train_vaes else []))
        steps = max(1, task.steps)
        metrics = {"expert_loss": expert_total / steps}
        if train_vaes:
            metrics["vae_nll"] = vae_total / steps
        return LocalResult(loss=(expert_total + vae_total) / steps, metrics=metrics)

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        """CE of the mixed prediction (the head answers log mixture probabilities)."""
        return F.nll_loss(model(x).target_logits.float(), y)

    # --- server-side ------------------------------------------------------------------------
    def secure_refusal(self) -> str:
        if self.params.weighting == "component":
            return (
                f"{self.run_name} with weighting=component weights each distribution by every "
                "site's count of scans in it, which secure aggregation hides; use "
                "weighting=site"
            )
        return super().secure_refusal()

    def check_stats(self, stats: Stats) -> None:
        super().check_stats(stats)
        counts = stats.get(ASSIGNED)
        if counts is not None and (
            len(counts) != self.params.components or any(c < 0 for c in counts)
        ):
            raise ValueError(
                f"fedgmi: scans per distribution must be {self.params.components} "
                f"non-negative counts, got {counts!r}"
            )

    def aggregate(self, updates: list[Update]) -> State:
        out = weighted_average(updates)
        if self.params.weighting != "component" or not all(ASSIGNED in u.stats for u in updates):
            return out  # round 1 (no partition yet), or counts kept on the sites
        for update in updates:
            self.check_stats(update.stats)
        counts = torch.tensor([u.stats[ASSIGNED] for u in updates], dtype=torch.float64)  # (S, M)
        totals = counts.sum(dim=0)
        for key in out:
            if not is_component_key(key):
                continue
            ref = updates[0].state[key]
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for update, site_counts in zip(updates, counts, strict=True):
                share = (site_counts / totals.clamp_min(1.0)).to(ref.device)
                acc += update.state[key].double() * share.view(-1, *([1] * (ref.dim() - 1)))
            # A distribution no site holds keeps the plain average (its weights did not move).
            trained = (totals > 0).to(ref.device).view(-1, *([1] * (ref.dim() - 1)))
            out[key] = torch.where(trained, acc.to(ref.dtype), out[key])
        if DECODER_OFFSET in out and bool((totals > 0).any()):
            for empty in (totals == 0).nonzero().flatten().tolist():
                self._split(out, int(totals.argmax()), empty, totals)
        return out

    def _split(self, out: State, parent: int, child: int, totals: torch.Tensor) -> None:
        """Re-seed a distribution no site holds from the one most scans hold (as in LBG vector
        quantization): the child copies the parent's VAE and expert, and the two move apart by
        a random offset, so the parent's scans split between them at the next partition."""
        for key, value in out.items():
            if is_component_key(key):
                value[child] = value[parent]
        # Seeded by what the server has seen, so a resumed run splits the same way.
        parts = [getattr(self, "_seed", 0), child, *(int(t) for t in totals.tolist())]
        seed = int(np.random.SeedSequence(parts).generate_state(1)[0])
        generator = torch.Generator().manual_seed(seed)
        offset = out[DECODER_OFFSET]
        blocks = getattr(self, "_blocks", offset.shape[1])
        shift = block_offsets(generator, offset.shape[1], blocks, SPLIT_OFFSET).to(offset)
        offset[parent] += shift
        offset[child] -= shift


def _bank(model: nn.Module) -> VAEBank:
    bank = getattr(model, "vaes", None)
    if not isinstance(bank, VAEBank):
        raise TypeError("FedGMI needs a mixture model (ModelSpec.mixture_components > 0)")
    return bank


def is_partition_round(round_: int, every: int) -> bool:
    """Rounds in which the VAEs travel: round 1 (their view statistics), then 2, 2 + every,
    2 + 2*every, ..., in which the sites re-assign their scans."""
    return round_ == 1 or (round_ >= 2 and (round_ - 2) % every == 0)


def is_component_key(key: str) -> bool:
    """Keys whose first axis is the distribution: the VAEs' weights and the experts."""
    if key.startswith(VAE_PREFIX):
        return key.removeprefix(VAE_PREFIX) not in VIEW_STATS
    return key in EXPERT_KEYS


@torch.no_grad()
def log_affinities(model: FedModel, x: torch.Tensor) -> torch.Tensor:
    """(N, M) MAP affinity of each scan to each distribution: ELBO + log of the site's prior.

    The prior is the site's current coefficients, smoothed by one scan per distribution so that
    a distribution the site has not seen yet can still claim scans.
    """
    bank = _bank(model)
    model.eval()
    elbo = (
        torch.cat(
            [bank.affinity(x[i : i + SCORE_BATCH]) for i in range(0, x.shape[0], SCORE_BATCH)]
        )
        * bank.dim
    )
    n, m = x.shape[0], bank.components
    prior = (model.target_head.coefficients.float() * n + 1.0) / (n + m)
    return elbo + torch.log(prior)[None]


def assign(model: FedModel, x: torch.Tensor) -> torch.Tensor:
    """(N,) the distribution each scan most likely comes from (MAP)."""
    return log_affinities(model, x).argmax(dim=1)


def expert_loss(model: FedModel, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor):
    """CE of each scan's label under the expert of its assigned distribution ``a``."""
    hidden = model.target_branch.body(model.backbone(x))
    logits = model.target_head.expert_logits(hidden).float()  # (N, M, C)
    return F.cross_entropy(logits[torch.arange(x.shape[0], device=x.device), a], y)


def vae_loss(bank: VAEBank, x: torch.Tensor, a: torch.Tensor, noise: torch.Tensor):
    """Negative ELBO per view dimension of each scan under its assigned distribution's VAE."""
    with torch.autocast(x.device.type, enabled=False):
        elbo = bank.elbo_of_view(bank.view(x), noise)  # (M, N)
    return -elbo[a, torch.arange(x.shape[0], device=x.device)].mean() / bank.dim


@torch.no_grad()
def expert_probabilities(model: FedModel, x: torch.Tensor) -> torch.Tensor:
    """(N, M, C) every expert's class probabilities (to compare experts across distributions)."""
    model.eval()
    hidden = model.target_branch.body(model.backbone(x))
    return torch.softmax(model.target_head.expert_logits(hidden).float(), dim=-1)
