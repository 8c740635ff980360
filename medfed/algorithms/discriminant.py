"""A client head set in closed form: Fisher's linear discriminant from the sites' statistics.

A client head ("which site is this scan from?") trained by gradient sees one site label per
site: each site's steps push it toward "mine", and averaging those pulls drifts to whichever
site spoke last (routing near chance on a frozen base; FedDRM's trained head on frozen ImageNet
features routed real photos at 0.67). When the features the head reads do not change during
training (a frozen base or a frozen encoder), the server can set it exactly instead: each site
reports, once, the count, sum and centred scatter of its training scans' features (never a
scan), and with per-site means mu_i, the pooled within-site covariance S (shrunk toward its mean
variance) and data shares pi_i,

    logit_i(f) = f' S^-1 mu_i - mu_i' S^-1 mu_i / 2 + log pi_i,

the Gaussian log-density of the scan's features under site i: FedDRM's density-ratio router
(log p(site i | scan) - log pi_i) applies unchanged. LoRA (frozen base) and FedDRM (frozen
encoder, :class:`ClosedFormClientHead`) use it.
"""

from __future__ import annotations

import torch

from medfed.algorithms.base import LocalResult, LocalTask, Stats, Update
from medfed.models.fedmodel import FedModel

CLIENT_HEAD = "client_head."
# What each site reports of its training scans' features (see the module docstring).
SITE, COUNT, SUM, SCATTER = "feature_site", "feature_count", "feature_sum", "feature_scatter"
SENT = "feature_statistics_sent"  # site-private: whether its statistics have gone out
DIGITS = 7  # significant digits of each statistic as it travels (float32 precision)
FEATURE_BATCH = 256


class ClosedFormClientHead:
    """What an algorithm with a closed-form client head adds: each site sends its feature
    statistics (once, while the features cannot change), and the server keeps every site's
    latest and sets the client head as soon as all have reported. A site that missed a round
    is still counted exactly. Mixed into an :class:`~medfed.algorithms.base.Algorithm` whose
    parameters have a ``shrinkage``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moments: dict[int, Stats] = {}  # server side: each site's statistics, by index

    @property
    def shrinkage(self) -> float:
        """Of the pooled feature covariance toward its mean variance."""
        return self.params.shrinkage

    def init_extra(self, model: FedModel) -> dict[str, torch.Tensor]:
        return {SENT: torch.zeros(1)}

    def report_moments(self, task: LocalTask, result: LocalResult, every_round: bool) -> None:
        """Add the site's feature statistics to ``result`` (every round when the features
        change, else once)."""
        if every_round or not float(task.extra[SENT].sum()):
            result.stats.update(feature_moments(task.model, task.batches.x, task.autocast))
            result.stats[SITE] = [float(task.site_index)]
            task.extra[SENT] = torch.ones(1)

    def holds_statistics(self, site: int) -> bool | None:
        return site in self.moments

    def check_stats(self, stats: Stats) -> None:
        super().check_stats(stats)
        self.check_moments(stats)

    def check_moments(self, stats: Stats) -> None:
        """Refuse (ValueError) a report that is not a whole set of feature statistics."""
        if not stats:  # sent once, with a site's first update
            return
        expected = {SITE, COUNT, SUM, SCATTER}
        if set(stats) != expected:
            raise ValueError(f"{self.name} expects {sorted(expected)}, got {sorted(stats)}")
        d = len(stats[SUM])
        sizes = (len(stats[SITE]), len(stats[COUNT]), len(stats[SCATTER]))
        if sizes != (1, 1, d * (d + 1) // 2) or stats[COUNT][0] < 1:
            raise ValueError("feature statistics of inconsistent sizes (site, count, scatter)")
        if stats[SITE][0] != int(stats[SITE][0]) or stats[SITE][0] < 0:
            raise ValueError(f"feature statistics name site {stats[SITE][0]}, not an index")

    def set_client_head(self, out: dict[str, torch.Tensor], updates: list[Update]) -> None:
        """Keep each update's statistics; once every site's are in, replace the averaged
        client head in ``out`` by the discriminant."""
        if f"{CLIENT_HEAD}bias" not in out:
            return
        k = n_sites(out)
        for update in updates:
            if update.stats:
                self.check_moments(update.stats)
                site = int(update.stats[SITE][0])
                if site >= k:
                    raise ValueError(f"feature statistics name site {site} of {k}")
                self.moments[site] = update.stats
        if len(self.moments) == k:
            weight, bias = discriminant([self.moments[i] for i in range(k)], self.shrinkage)
            ref_w, ref_b = out[f"{CLIENT_HEAD}weight"], out[f"{CLIENT_HEAD}bias"]
            if tuple(ref_w.shape) != tuple(weight.shape):
                raise ValueError(
                    f"feature statistics of width {weight.shape[1]} for a client head of width "
                    f"{ref_w.shape[1]}"
                )
            out[f"{CLIENT_HEAD}weight"] = weight.to(ref_w.dtype)
            out[f"{CLIENT_HEAD}bias"] = bias.to(ref_b.dtype)

    def secure_refusal(self) -> str:
        return (
            f"{self.run_name} fits its client head from each site's feature statistics, which "
            "the server must read site by site; secure aggregation gives it only the sum"
        )


def n_sites(state: dict[str, torch.Tensor]) -> int:
    """Rows of the client head: the federation's number of sites."""
    return int(state[f"{CLIENT_HEAD}bias"].shape[0])


@torch.no_grad()
def feature_moments(model: FedModel, x: torch.Tensor, autocast) -> Stats:
    """Count, sum and upper-triangle centred scatter (sum of (f - mean)(f - mean)') of what the
    client head reads for ``x`` (its branch's output), each to float32 precision."""
    was_training = model.training
    model.eval()
    total, square, n = None, None, 0
    try:
        for start in range(0, x.shape[0], FEATURE_BATCH):
            xb = x[start : start + FEATURE_BATCH]
            with autocast():
                f = model.client_branch(model.client_features(xb)).double()
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
