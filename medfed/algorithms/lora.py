"""LoRA personalization (PEFT): a trained, frozen base and named low-rank adapters.

LoRA is for adapting a base that already works: with ``base = "frozen"`` (the default) the run
must start from trained weights (``--init``: a finished FedAvg run, torchvision's ResNet-18, a
state dict), or build that base itself first (``warmup_rounds = N``: N rounds of FedAvg, then
frozen). The frozen weights never change and never leave a site.

Modes:
- ``private``: one adapter per site, named by its site id, never leaves the site (pure
  personalization);
- ``shared``: one adapter, averaged across sites.
Each site keeps its target head in both. ``freeze_a = true`` is FFA-LoRA: every A matrix stays
at its seeded random initialization (the same on every site) and only B is trained and shared,
which makes averaging a shared adapter exact (the mean of B A is the mean of B times A).

Routing. The client head reads the base's features with every adapter off
(:meth:`medfed.models.fedmodel.FedModel.client_features`): a site's own adapter must not tell
it "this scan is mine". It is not trained by gradient: each site sees one site label only, and
a client head trained that way on a frozen base drifts to whichever site spoke last (routing at
chance). It is Fisher's linear discriminant instead, set by the server from what every site
reports beside its update (``LocalResult.stats``): the count, sum and scatter of its training
scans' base features, never a scan. With per-site means mu_i, the pooled covariance S (shrunk
toward its mean variance) and data shares pi_i, logit_i(f) = f' S^-1 mu_i - mu_i' S^-1 mu_i / 2
+ log pi_i: the Gaussian log-density of the scan's features under site i, so the density-ratio
router of FedDRM (log p(site i | scan) - log pi_i) applies unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from medfed.algorithms.base import (
    HEAD_PREFIX,
    Algorithm,
    LocalResult,
    LocalTask,
    Params,
    Stats,
    Update,
    supervised_steps,
    weighted_average,
)
from medfed.errors import ConfigError
from medfed.models.fedmodel import FedModel, ModelSpec

SHARED_ADAPTER = "shared"
CLIENT_HEAD = "client_head."
# What each site reports of its training scans' base features (see the module docstring).
SITE, COUNT, SUM, SCATTER = "feature_site", "feature_count", "feature_sum", "feature_scatter"
SENT = "feature_statistics_sent"  # site-private: whether its statistics have gone out
DIGITS = 7  # significant digits of each statistic as it travels (float32 precision)
FEATURE_BATCH = 256
# The widest layer of the backbones here has 512 channels; an adapter of rank r holds r * (in +
# out) numbers per layer, so beyond this a "low-rank" adapter outgrows the layer it adapts.
MAX_RANK = 256


@dataclass(frozen=True)
class LoRAParams(Params):
    rank: int = 4
    alpha: float = 8.0
    mode: str = "private"  # private adapters, or one shared adapter
    base: str = "frozen"  # frozen, or federated (trained and averaged like FedAvg)
    targets: str = "conv,linear"  # layer kinds that get adapters
    freeze_a: bool = False  # FFA-LoRA: A stays at its random init, only B is trained and shared
    warmup_rounds: int = 0  # FedAvg rounds that build the base before it is frozen (no --init)
    shrinkage: float = 0.1  # of the pooled feature covariance toward its mean variance

    def __post_init__(self) -> None:
        if not 1 <= self.rank <= MAX_RANK:
            raise ValueError(
                f"rank must be between 1 and {MAX_RANK} (got {self.rank}): a higher rank is "
                "more than a full update of any layer here, and its adapters can exhaust memory"
            )
        if not self.alpha > 0:
            raise ValueError(
                f"alpha must be > 0 (got {self.alpha:g}): the adapters' scale alpha / rank would "
                "switch them off or reverse them"
            )
        if self.mode not in ("private", "shared"):
            raise ValueError("mode must be private or shared")
        if self.base not in ("frozen", "federated"):
            raise ValueError("base must be frozen or federated")
        if not set(self.target_kinds) <= {"conv", "linear"} or not self.target_kinds:
            raise ValueError("targets must be conv, linear or conv,linear")
        if self.warmup_rounds < 0:
            raise ValueError("warmup_rounds must be >= 0")
        if not 0.0 < self.shrinkage <= 1.0:
            raise ValueError("shrinkage must be in (0, 1]")

    @property
    def target_kinds(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())


def is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


class LoRA(Algorithm):
    name = "lora"
    summary = "PEFT LoRA adapters per site (or one shared) on a trained frozen base; routes"
    dp_refusal = (
        "its sites send their training scans' feature means and covariances in the clear for "
        "routing, which DP-SGD does not cover"
    )
    params_class = LoRAParams
    needs_client_branch = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Server side: each site's latest feature statistics, by site index. With a frozen base
        # they never change, so a site that missed a round is still counted exactly.
        self.moments: dict[int, Stats] = {}

    def adapt_spec(self, spec: ModelSpec, site_ids: list[str]) -> ModelSpec:
        if self.params.mode == "shared" and SHARED_ADAPTER in site_ids:
            raise ConfigError(
                f"lora with mode=shared names its adapter {SHARED_ADAPTER!r}, which is also a "
                "site id; rename that site (its manifest's id) or use mode=private"
            )
        adapters = tuple(site_ids) if self.params.mode == "private" else (SHARED_ADAPTER,)
        return replace(
            spec,
            lora_rank=self.params.rank,
            lora_alpha=self.params.alpha,
            lora_adapters=adapters,
            lora_targets=self.params.target_kinds,
            client_kind="linear",
        )

    def check_start(self, init: bool) -> None:
        if init or self.params.base == "federated":
            return
        if self.params.warmup_rounds:
            raise ConfigError(
                "lora: warmup_rounds builds the base in one process (medfed train); in a "
                "deployment, train a fedavg run first and pass it as --init"
            )
        raise ConfigError(
            "lora freezes its base and trains only small adapters on top: on random weights "
            "that base is noise, and the adapters cannot make up for it. Start from trained "
            "weights with --init (a finished fedavg run's folder, torchvision:resnet18, or a "
            "state-dict file), or let medfed build the base first with --param "
            "warmup_rounds=N (N rounds of FedAvg, then frozen); --param base=federated "
            "trains the base too"
        )

    def _trainable(self, key: str) -> bool:
        """Keys the local objective updates (the rest is the frozen base, FFA-LoRA's A, and the
        client head, which the server sets)."""
        if key.startswith(CLIENT_HEAD) or (self.params.freeze_a and ".lora_A." in key):
            return False
        return self.params.base == "federated" or is_adapter_key(key) or key.startswith(HEAD_PREFIX)

    def private_keys(self, model: nn.Module) -> set[str]:
        keys = set(model.state_dict())
        # A frozen base (and frozen A) never changes, is the same on every site, never travels;
        # the client head comes from the server.
        private = {k for k in keys if not self._trainable(k) and not k.startswith(CLIENT_HEAD)}
        private |= {k for k in keys if k.startswith(HEAD_PREFIX)}
        if self.params.mode == "private":
            private |= {k for k in keys if is_adapter_key(k)}
        return private

    # --- site-side --------------------------------------------------------------------------
    def local_train(self, task: LocalTask) -> LocalResult:
        model = task.model
        own = f".{model.adapter_for(task.site_id)}."
        model.select_adapter(model.adapter_for(task.site_id))
        params = []
        for name, p in model.named_parameters():
            active = self._trainable(name) and (not is_adapter_key(name) or own in name)
            p.requires_grad_(active)
            if active:
                params.append(p)
        try:
            result = supervised_steps(task, model, params, self.loss)
        finally:
            for p in model.parameters():
                p.requires_grad_(True)
        # A frozen base gives the same features every round: its statistics travel once.
        if self.params.base == "federated" or not float(task.extra[SENT].sum()):
            result.stats.update(feature_moments(model, task.batches.x, task.autocast))
            result.stats[SITE] = [float(task.site_index)]
            task.extra[SENT] = torch.ones(1)
        return result

    def init_extra(self, model: FedModel) -> dict[str, torch.Tensor]:
        return {SENT: torch.zeros(1)}

    def loss(self, task: LocalTask, model: FedModel, x: torch.Tensor, y: torch.Tensor):
        """The target label only (the client head is not trained by gradient)."""
        logits = model.target_head(model.target_branch(model.features(x)))
        return F.cross_entropy(logits.float(), y)

    # --- server-side ------------------------------------------------------------------------
    def secure_refusal(self) -> str:
        return (
            f"{self.run_name} fits its client head from each site's feature statistics, which "
            "the server must read site by site; secure aggregation gives it only the sum"
        )

    def check_stats(self, stats: Stats) -> None:
        super().check_stats(stats)
        if not stats:  # sent once, with a site's first update, when the base is frozen
            return
        expected = {SITE, COUNT, SUM, SCATTER}
        if set(stats) != expected:
            raise ValueError(f"lora expects {sorted(expected)}, got {sorted(stats)}")
        d = len(stats[SUM])
        sizes = (len(stats[SITE]), len(stats[COUNT]), len(stats[SCATTER]))
        if sizes != (1, 1, d * (d + 1) // 2) or stats[COUNT][0] < 1:
            raise ValueError("feature statistics of inconsistent sizes (site, count, scatter)")
        if stats[SITE][0] != int(stats[SITE][0]) or stats[SITE][0] < 0:
            raise ValueError(f"feature statistics name site {stats[SITE][0]}, not an index")

    def aggregate(self, updates: list[Update]) -> dict[str, torch.Tensor]:
        out = weighted_average(updates)
        if f"{CLIENT_HEAD}bias" not in out:
            return out
        k = n_sites(out)
        for update in updates:
            if update.stats:
                self.check_stats(update.stats)
                site = int(update.stats[SITE][0])
                if site >= k:
                    raise ValueError(f"feature statistics name site {site} of {k}")
                self.moments[site] = update.stats
        if len(self.moments) == k:  # every site has reported: the discriminant is defined
            ordered = [self.moments[i] for i in range(k)]
            weight, bias = discriminant(ordered, self.params.shrinkage)
            ref_w, ref_b = out[f"{CLIENT_HEAD}weight"], out[f"{CLIENT_HEAD}bias"]
            out[f"{CLIENT_HEAD}weight"] = weight.to(ref_w.dtype)
            out[f"{CLIENT_HEAD}bias"] = bias.to(ref_b.dtype)
        return out


def n_sites(state: dict[str, torch.Tensor]) -> int:
    """Rows of the client head: the federation's number of sites."""
    return int(state[f"{CLIENT_HEAD}bias"].shape[0])


@torch.no_grad()
def feature_moments(model: FedModel, x: torch.Tensor, autocast) -> Stats:
    """Count, sum and upper-triangle centred scatter (sum of (f - mean)(f - mean)') of the
    base's features of ``x``, each to float32 precision."""
    was_training = model.training
    model.eval()
    total, square, n = None, None, 0
    try:
        for start in range(0, x.shape[0], FEATURE_BATCH):
            xb = x[start : start + FEATURE_BATCH]
            with autocast():
                f = model.client_features(xb).double()
            total = f.sum(0) if total is None else total + f.sum(0)
            square = f.T @ f if square is None else square + f.T @ f
            n += f.shape[0]
    finally:
        model.train(was_training)
    mean = total / n
    centred = square - n * torch.outer(mean, mean)
    rows, cols = torch.triu_indices(square.shape[0], square.shape[0])
    return {
        COUNT: [float(n)],
        SUM: _short(total),
        SCATTER: _short(centred[rows, cols]),
    }


def _short(values: torch.Tensor) -> list[float]:
    """``values`` to float32 precision, which also keeps their JSON short."""
    return [float(f"{v:.{DIGITS}g}") for v in values.cpu().tolist()]


def discriminant(stats: list[Stats], shrinkage: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fisher's linear discriminant from every site's feature moments (in site order, each
    scatter centred on its site's mean): the client head's weight (K, D) and bias (K,)."""
    counts = torch.tensor([s[COUNT][0] for s in stats], dtype=torch.float64)
    sums = torch.tensor([s[SUM] for s in stats], dtype=torch.float64)
    d = sums.shape[1]
    rows, cols = torch.triu_indices(d, d)
    scatter = torch.zeros(d, d, dtype=torch.float64)
    for s in stats:
        upper = torch.zeros(d, d, dtype=torch.float64)
        upper[rows, cols] = torch.tensor(s[SCATTER], dtype=torch.float64)
        scatter += upper + upper.T - torch.diag(upper.diagonal())
    means = sums / counts[:, None]
    cov = scatter / max(float(counts.sum()) - len(stats), 1.0)  # the pooled within-site one
    scale = float(cov.diagonal().mean()) or 1.0
    cov = (1.0 - shrinkage) * cov + shrinkage * scale * torch.eye(d, dtype=torch.float64)
    solved = torch.linalg.solve(cov, means.T).T  # S^-1 mu_i, one row per site
    priors = counts / counts.sum()
    bias = -0.5 * (solved * means).sum(1) + torch.log(priors)
    if not (torch.isfinite(solved).all() and torch.isfinite(bias).all()):
        raise ValueError("the sites' feature statistics give no finite discriminant")
    return solved.float(), bias.float()
