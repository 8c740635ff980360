"""FedGMI's model parts: M small VAEs over a coarse view of the scan, and M expert heads mixed
by a site's mixture coefficients.

The VAEs never see the backbone: each models a fixed, cheap view of the scan, so what they learn
does not move with the classifier. The view has two halves, both pooled to ``resolution`` per
spatial axis: the scan itself (colour cast, brightness, field of view) and the log of its local
detail energy, |x - 3x3 mean of x| (blur, noise, sharpness), which a coarse thumbnail would lose.
Each dimension is standardized by the federation's moments of the view (measured in round 1),
so a VAE starts near the data and no dimension drowns the others in the likelihood.

The model keeps the FedModel contract (features -> target_branch -> target_head), so inference,
routing and evaluation need nothing new: the features end with the M per-dimension VAE
log-likelihoods of the scan, the branch passes them through, and the head turns them, with the
site's coefficients, into the posterior over distributions that mixes the experts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VAE_PREFIX = "vaes."
COEFFICIENTS = "target_head.coefficients"  # the MixtureHead buffer: a site's shares
VIEW_STATS = ("view_mean", "view_sq", "calibrated")  # VAEBank buffers shared by all components
LOG_SCALE_MIN, LOG_SCALE_MAX = -3.0, 3.0
DETAIL_EPS = 1e-3
PREDICT_RULES = ("posterior", "coefficients")


def scan_view(x: torch.Tensor, resolution: int) -> torch.Tensor:
    """(N, C, *S) scans -> (N, D) coarse view: pooled intensities and pooled log detail energy."""
    x = x.float()
    dims = x.dim() - 2
    size = (resolution,) * dims
    if dims == 2:
        pool, local = F.adaptive_avg_pool2d, F.avg_pool2d
    else:
        pool, local = F.adaptive_avg_pool3d, F.avg_pool3d
    detail = (x - local(x, 3, stride=1, padding=1, count_include_pad=False)).abs()
    parts = [pool(x, size), torch.log(pool(detail, size) + DETAIL_EPS)]
    return torch.cat([p.flatten(1) for p in parts], dim=1)


def view_resolution(resolution: int, spatial_dims: int) -> int:
    """Pooling size per axis: ``resolution`` for images, half of it for volumes (same budget)."""
    return resolution if spatial_dims == 2 else max(2, resolution // 2)


class VAEBank(nn.Module):
    """M Gaussian VAEs side by side (one weight tensor per layer, component first).

    Encoder D -> H -> 2L (mean, log-variance), decoder L -> H -> D, and a learned log standard
    deviation per output dimension, so the ELBO is a proper (lower bound of a) log-likelihood
    that can be compared across components and added to a log prior.
    """

    def __init__(
        self, components: int, in_channels: int, spatial_dims: int, resolution: int, latent: int
    ) -> None:
        super().__init__()
        self.components, self.latent, self.hidden = components, latent, 64
        self.resolution = view_resolution(resolution, spatial_dims)
        self.dim = 2 * in_channels * self.resolution**spatial_dims
        self.in_channels = in_channels
        m, d, h, z = components, self.dim, self.hidden, latent
        self.enc_w1 = nn.Parameter(torch.empty(m, d, h))
        self.enc_b1 = nn.Parameter(torch.empty(m, h))
        self.enc_w2 = nn.Parameter(torch.empty(m, h, 2 * z))
        self.enc_b2 = nn.Parameter(torch.empty(m, 2 * z))
        self.dec_w1 = nn.Parameter(torch.empty(m, z, h))
        self.dec_b1 = nn.Parameter(torch.empty(m, h))
        self.dec_w2 = nn.Parameter(torch.empty(m, h, d))
        self.dec_b2 = nn.Parameter(torch.empty(m, d))  # the offset the decoder starts from
        self.log_scale = nn.Parameter(torch.zeros(m, d))
        # The federation's first two moments of the view (each site's, averaged in round 1).
        self.register_buffer("view_mean", torch.zeros(d))
        self.register_buffer("view_sq", torch.ones(d))
        self.register_buffer("calibrated", torch.zeros(()))
        with torch.no_grad():
            for k in range(m):
                self.set_component(k, self.candidate(torch.Generator().manual_seed(k), 0.0))

    # ------------------------------------------------------------------ parameters
    def component(self, k: int) -> dict[str, torch.Tensor]:
        """Component ``k``'s tensors, by parameter name."""
        return {name: p[k].detach().clone() for name, p in self.named_parameters()}

    @torch.no_grad()
    def set_component(self, k: int, values: dict[str, torch.Tensor]) -> None:
        for name, p in self.named_parameters():
            p[k].copy_(values[name].to(p.device, p.dtype))

    def candidate(self, generator: torch.Generator, offset_scale: float) -> dict[str, torch.Tensor]:
        """A random VAE: uniform hidden layers of variance 1/fan_in, and an output that starts at
        a random offset per channel of each half of the view (an acquisition setting)."""
        d, h, z = self.dim, self.hidden, self.latent

        def layer(fan_in: int, fan_out: int) -> tuple[torch.Tensor, torch.Tensor]:
            bound = 1.0 / math.sqrt(fan_in)
            w = (torch.rand(fan_in, fan_out, generator=generator) * 2 - 1) * bound * math.sqrt(3)
            b = (torch.rand(fan_out, generator=generator) * 2 - 1) * bound
            return w, b

        enc_w1, enc_b1 = layer(d, h)
        enc_w2, enc_b2 = layer(h, 2 * z)
        dec_w1, dec_b1 = layer(z, h)
        # A zero output layer: the candidate starts as a Gaussian centred on its offset, so the
        # first partition is by acquisition setting, not by the noise of random weights.
        dec_w2 = torch.zeros(h, d)
        dec_b2 = block_offsets(generator, d, self.blocks, offset_scale)
        return {
            "enc_w1": enc_w1, "enc_b1": enc_b1, "enc_w2": enc_w2, "enc_b2": enc_b2,
            "dec_w1": dec_w1, "dec_b1": dec_b1, "dec_w2": dec_w2, "dec_b2": dec_b2,
            "log_scale": torch.zeros(d),
        }  # fmt: skip

    @property
    def blocks(self) -> int:
        """The view's blocks of one kind: (intensity, detail) x channel."""
        return 2 * self.in_channels

    # ------------------------------------------------------------------ the model
    def view(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) standardized view of the scans."""
        std = (self.view_sq - self.view_mean.pow(2)).clamp_min(1e-6).sqrt()
        return (scan_view(x, self.resolution) - self.view_mean) / std

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor, batch: int = 256) -> None:
        """Set the view moments to those of ``x`` (a site's training scans)."""
        views = torch.cat(
            [scan_view(x[i : i + batch], self.resolution) for i in range(0, len(x), batch)]
        )
        self.view_mean.copy_(views.mean(dim=0))
        self.view_sq.copy_(views.pow(2).mean(dim=0))
        self.calibrated.fill_(1.0)

    @property
    def is_calibrated(self) -> bool:
        return bool(self.calibrated > 0.5)

    def encode(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, D) views -> mean and log-variance, each (M, N, L)."""
        h = torch.relu(torch.einsum("nd,mdh->mnh", v, self.enc_w1) + self.enc_b1[:, None])
        out = torch.einsum("mnh,mhk->mnk", h, self.enc_w2) + self.enc_b2[:, None]
        mean, logvar = out.chunk(2, dim=-1)
        return mean, logvar.clamp(-8.0, 8.0)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """(M, N, L) latents -> (M, N, D) reconstruction means."""
        h = torch.relu(torch.einsum("mnl,mlh->mnh", z, self.dec_w1) + self.dec_b1[:, None])
        return torch.einsum("mnh,mhd->mnd", h, self.dec_w2) + self.dec_b2[:, None]

    def elbo_of_view(self, v: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """(M, N) ELBO in nats of every view under every component; ``noise`` (M, N, L) draws
        the latent (training), None decodes the posterior mean (scoring: deterministic)."""
        mean, logvar = self.encode(v)
        z = mean if noise is None else mean + torch.exp(0.5 * logvar) * noise
        recon = self.decode(z)
        log_scale = self.log_scale.clamp(LOG_SCALE_MIN, LOG_SCALE_MAX)[:, None]
        resid = (v[None] - recon) * torch.exp(-log_scale)
        log_lik = -0.5 * resid.pow(2) - log_scale - 0.5 * math.log(2 * math.pi)
        kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).sum(-1)
        return log_lik.sum(-1) - kl

    def affinity(self, x: torch.Tensor) -> torch.Tensor:
        """(N, M) per-dimension ELBO of each scan under each component (float32)."""
        with torch.autocast(x.device.type, enabled=False):
            return self.elbo_of_view(self.view(x)).T / self.dim


def block_offsets(generator: torch.Generator, dim: int, blocks: int, scale: float) -> torch.Tensor:
    """(dim,) a random offset per block of the view (half x channel), the same at every
    position: a shift of colour, brightness or sharpness rather than of one pixel."""
    return (torch.randn(blocks, generator=generator) * scale).repeat_interleave(dim // blocks)


def vae_divergence(
    bank: VAEBank,
    candidates: list[dict[str, torch.Tensor]],
    probes: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """(K, K) symmetric divergence between candidate VAEs: the KL between their joint models
    p(z) p(x|z) when they share the prior and a unit output scale, E_z ||mu_a(z) - mu_b(z)||^2 / 2,
    estimated on the same latent draws for every candidate (data-free)."""
    z = torch.randn(probes, bank.latent, generator=generator)
    means = []
    for c in candidates:
        h = torch.relu(z @ c["dec_w1"] + c["dec_b1"])
        means.append(h @ c["dec_w2"] + c["dec_b2"])
    stacked = torch.stack(means)  # (K, P, D)
    diff = stacked[:, None] - stacked[None]
    return 0.5 * diff.pow(2).sum(-1).mean(-1)


def greedy_spread(divergence: torch.Tensor, m: int) -> list[int]:
    """Pick ``m`` indices that greedily maximize pairwise divergence: the farthest pair first,
    then, one at a time, the candidate farthest from its closest chosen one."""
    k = divergence.shape[0]
    if m > k:
        raise ValueError(f"cannot choose {m} of {k} candidates")
    if m == 1:
        return [0]
    flat = int(torch.argmax(divergence + torch.eye(k) * -1.0))
    chosen = [flat // k, flat % k]
    while len(chosen) < m:
        closest = divergence[:, chosen].min(dim=1).values
        closest[chosen] = -1.0
        chosen.append(int(torch.argmax(closest)))
    return chosen


class MixtureBranch(nn.Sequential):
    """The usual target branch on the backbone features; the M trailing VAE log-likelihoods
    pass through untouched (same state keys as a plain branch)."""

    def __init__(self, feat_dim: int, branch_dim: int, components: int) -> None:
        super().__init__(nn.Linear(feat_dim, branch_dim), nn.LayerNorm(branch_dim), nn.ReLU())
        self.components = components

    def body(self, features: torch.Tensor) -> torch.Tensor:
        """The branch on backbone features alone (training the experts needs no VAE)."""
        return super().forward(features)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        body, scores = features[:, : -self.components], features[:, -self.components :]
        # float32 scores: the head multiplies them back by D, which bf16 could not carry.
        return torch.cat([self.body(body).float(), scores.float()], dim=1)


class MixtureHead(nn.Module):
    """M expert heads and the site's mixture coefficients; answers log mixture probabilities.

    ``posterior``: expert m weighs p(m | x) ∝ pi_m exp(ELBO_m(x)); ``coefficients``: pi_m.
    ``coefficients`` is a buffer: the site's share of scans per distribution, kept with the
    site's model so that the saved model answers with it.
    """

    def __init__(
        self, branch_dim: int, n_classes: int, components: int, view_dim: int, predict: str
    ) -> None:
        super().__init__()
        if predict not in PREDICT_RULES:
            raise ValueError(f"mixture prediction rule must be one of {PREDICT_RULES}")
        self.components, self.view_dim, self.predict = components, view_dim, predict
        self.weight = nn.Parameter(torch.empty(components, n_classes, branch_dim))
        self.bias = nn.Parameter(torch.zeros(components, n_classes))
        nn.init.kaiming_normal_(self.weight, mode="fan_in", nonlinearity="relu")
        self.register_buffer("coefficients", torch.full((components,), 1.0 / components))

    def expert_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, branch_dim) -> (N, M, C) every expert's logits."""
        return torch.einsum("nb,mcb->nmc", hidden, self.weight) + self.bias

    def log_weights(self, scores: torch.Tensor) -> torch.Tensor:
        """(N, M) log weight of each expert for each scan, from the per-dimension ELBOs."""
        log_pi = torch.log(self.coefficients.float().clamp_min(1e-6))
        if self.predict == "coefficients":
            return log_pi.expand(scores.shape[0], -1)
        return torch.log_softmax(scores.float() * self.view_dim + log_pi, dim=1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        body, scores = hidden[:, : -self.components], hidden[:, -self.components :]
        log_probs = torch.log_softmax(self.expert_logits(body).float(), dim=-1)
        return torch.logsumexp(self.log_weights(scores)[:, :, None] + log_probs, dim=1)
