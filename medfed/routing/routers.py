"""Routing a new scan to the site whose model fits it best, or abstaining.

Every router takes the scan as each site sees it (``views[i]``: the scan under site i's own
preprocessing) and returns per-site probabilities, the chosen site (or abstain) and the answer:

- ``density_ratio`` (FedDRM): score_i = log p(site i | scan) - log(pi_i), pi_i = n_i / N, the
  client posterior taken on site i's view (and from site i's model where more than the heads
  differ); site probabilities are the softmax of the scores; the chosen site's target head
  answers. With one view and one model this is the paper's client logit_i - log(pi_i). When only
  the target heads differ between sites this is one batched forward pass;
- ``one_pass`` (FedDRM): the density ratio read from one site model's client head (chosen on
  the validation scans at publish time), then the chosen site's model answers: two forward
  passes at most, however many sites, as the reference method's one shared model routes;
- ``soft`` (FedDRM): as density_ratio, but the answer mixes the top sites' predictions by their
  probability;
- ``majority_vote`` (baselines): every site model answers (m forward passes), the majority wins;
- ``max_confidence``: the site model most confident in its own answer is chosen.

Abstention: a scan whose features sit far from every site's training features (Mahalanobis
distance above the threshold calibrated on the validation splits) is flagged, not forced onto a
site.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from medfed.core.errors import ConfigError
from medfed.metrics import ABSTAIN, majority_vote
from medfed.routing.bundle import SiteOutputs, TrainedFederation


def density_ratio_scores(client_logits: np.ndarray, priors: np.ndarray) -> np.ndarray:
    """client log-posterior (or logit) minus log prior, per site: (n, K) -> (n, K)."""
    priors = np.asarray(priors, dtype=np.float64)
    if priors.ndim != 1 or priors.shape[0] != client_logits.shape[1]:
        raise ValueError(
            f"priors has shape {priors.shape}, expected ({client_logits.shape[1]},) (one per site)"
        )
    if np.any(priors <= 0):
        raise ValueError("site priors must be > 0 (every site contributes training data)")
    return np.asarray(client_logits, dtype=np.float64) - np.log(priors)[None, :]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64: (n, K) -> (n, K)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def route_density_ratio(
    client_logits: np.ndarray, priors: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Site probabilities (softmax of the density-ratio scores) and the chosen site per scan."""
    scores = density_ratio_scores(client_logits, priors)
    return softmax(scores), scores.argmax(axis=1)


def posterior_scores(client_logits: np.ndarray, priors: np.ndarray) -> np.ndarray:
    """FedDRM's density-ratio scores from every site model's client posterior: (K, n, K) -> (n, K).

    By Bayes, p(site k | x) / pi_k = p(x | site k) / p(x): the client posterior divided by the
    training share is a density ratio, and with every site equally likely to be asked, the
    routing posterior is P(site k | x) = softmax_k(log p(k | x) - log pi_k). Site i's model
    gives one such estimate on its own view of the scan (its normalization, its private norm
    layers); the sites' estimates are pooled as the mean of their log-posteriors (one shared
    client head read K times), so every site's model speaks for every site, not only for itself.
    """
    log_post = np.stack([log_softmax(c) for c in client_logits])  # (K models, n, K sites)
    return density_ratio_scores(log_post.mean(axis=0), priors)


@dataclass
class RouteResult:
    """One router's decision for a batch of n scans over K sites and C classes."""

    site_probs: np.ndarray  # (n, K)
    routed: np.ndarray  # (n,) the best site, abstention aside
    abstained: np.ndarray  # (n,) bool
    ood_score: np.ndarray  # (n,) distance to the closest site (NaN without calibration)
    class_probs: np.ndarray  # (n, C) the federation's answer
    prediction: np.ndarray  # (n,)

    @property
    def chosen(self) -> np.ndarray:
        """The routed site, or ABSTAIN (-1)."""
        return np.where(self.abstained, ABSTAIN, self.routed)


class Router:
    """Base class: subclasses decide the site and the answer from every site's outputs."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""  # one line, shown by the CLI's help
    needs_client_head: ClassVar[bool] = False

    def decide(
        self, fed: TrainedFederation, out: SiteOutputs
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(site_probs (n,K), routed (n,), class_probs (n,C)) of the answer."""
        raise NotImplementedError

    def predict(
        self,
        fed: TrainedFederation,
        answer: np.ndarray,
        site_probs: np.ndarray,
        out: SiteOutputs | None,
    ) -> np.ndarray:
        """The answer's class per scan: for a two-class task whose sites have operating points,
        positive iff P(positive) reaches the answering site's threshold; otherwise the most
        probable class (ties to the lower one)."""
        thresholds = fed.thresholds
        if thresholds is None or answer.shape[1] != 2:
            return answer.argmax(axis=1)
        return (answer[:, 1] >= self.answer_threshold(thresholds, site_probs)).astype(np.int64)

    def answer_threshold(self, thresholds: np.ndarray, site_probs: np.ndarray) -> np.ndarray:
        """The threshold the answer is held to, per scan: the chosen site's."""
        return thresholds[site_probs.argmax(axis=1)]

    def forward_passes(self, fed: TrainedFederation) -> int:
        return 1 if fed.shared_body else len(fed.sites)

    def route(self, fed: TrainedFederation, views: list[torch.Tensor]) -> RouteResult:
        return self.answer(fed, fed.outputs(views))

    def answer(self, fed: TrainedFederation, out: SiteOutputs) -> RouteResult:
        """The decision from every site's outputs (computed once, shared between routers)."""
        site_probs, routed, class_probs = self.decide(fed, out)
        score = None if fed.abstention is None else fed.abstention.scores(out.features)
        return self.result(fed, site_probs, routed, class_probs, score, out)

    def result(
        self,
        fed: TrainedFederation,
        site_probs: np.ndarray,
        routed: np.ndarray,
        class_probs: np.ndarray,
        score: np.ndarray | None,
        out: SiteOutputs | None,
    ) -> RouteResult:
        """The result of a decision, with abstention by ``score`` (None: never abstains)."""
        n = class_probs.shape[0]
        if score is not None and fed.abstention is not None:
            abstained = ~(score <= fed.abstention.threshold)  # a NaN score never routes
        else:
            score, abstained = np.full(n, np.nan), np.zeros(n, dtype=bool)
        return RouteResult(
            site_probs=site_probs,
            routed=routed,
            abstained=abstained,
            ood_score=score,
            class_probs=class_probs,
            prediction=self.predict(fed, class_probs, site_probs, out),
        )


def _pick(class_probs: np.ndarray, routed: np.ndarray) -> np.ndarray:
    return class_probs[routed, np.arange(class_probs.shape[1])]


class DensityRatioRouter(Router):
    name = "density_ratio"
    summary = "FedDRM: the site maximizing its client posterior minus log of its data share"
    needs_client_head = True

    def scores(self, fed: TrainedFederation, out: SiteOutputs) -> np.ndarray:
        """The uncalibrated density-ratio scores (n, K): log p(x | site k) up to a constant."""
        return posterior_scores(out.client_logits, fed.priors)

    def decide(self, fed, out):
        scores = self.scores(fed, out)
        site_probs = softmax(scores / fed.routing_temperature)
        routed = scores.argmax(axis=1)
        return site_probs, routed, _pick(out.class_probs, routed)


class SoftRouter(DensityRatioRouter):
    """Density-ratio routing whose answer mixes the top sites' predictions (beyond the paper)."""

    name = "soft"
    summary = "as density_ratio, but the answer mixes the top sites' predictions"
    top_k: int = 2

    def weights(self, site_probs: np.ndarray) -> np.ndarray:
        """(n, K) mixing weights: the top sites' probabilities, renormalized."""
        k = min(self.top_k, site_probs.shape[1])
        keep = np.argsort(-site_probs, axis=1)[:, :k]
        weights = np.zeros_like(site_probs)
        np.put_along_axis(weights, keep, np.take_along_axis(site_probs, keep, axis=1), axis=1)
        return weights / weights.sum(axis=1, keepdims=True)

    def decide(self, fed, out):
        site_probs, routed, _ = super().decide(fed, out)
        mixed = np.einsum("nk,knc->nc", self.weights(site_probs), out.class_probs)
        return site_probs, routed, mixed

    def answer_threshold(self, thresholds: np.ndarray, site_probs: np.ndarray) -> np.ndarray:
        """The mixed answer is held to the sites' thresholds mixed by the same weights."""
        return self.weights(site_probs) @ thresholds


class OnePassRouter(Router):
    """FedDRM's density ratio read from one site model's client head, as the reference method
    routes with its one shared model: that model's pass gives P(site | scan) for every site,
    and the chosen site's model answers. Two forward passes at most, whatever the number of
    sites (one when the routing site is chosen). The routing site and its temperature were
    chosen on the validation scans when the model was published (``RoutingFit``). Abstention
    measures the distance to the routing and the chosen sites only: the models it ran."""

    name = "one_pass"
    summary = "FedDRM: one site model's client head routes, the chosen site answers (<= 2 passes)"
    needs_client_head = True

    def forward_passes(self, fed: TrainedFederation) -> int:
        return 1 if fed.shared_body else 2

    def routing_site(self, fed: TrainedFederation) -> tuple[int, float]:
        fit = fed.routing
        if fit is None or fit.one_pass_site is None or fit.one_pass_temperature is None:
            raise ConfigError(
                "router 'one_pass' needs the routing site chosen when the model was published; "
                "this model has none (published before it, or its sites share one model): "
                "use density_ratio"
            )
        return fit.one_pass_site, fit.one_pass_temperature

    def posterior(
        self, fed: TrainedFederation, client_logits: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(site probabilities (n, K), routed (n,)) from the routing site's client logits."""
        _, temperature = self.routing_site(fed)
        scores = density_ratio_scores(log_softmax(client_logits), fed.priors)
        return softmax(scores / temperature), scores.argmax(axis=1)

    def decide(self, fed, out):
        site, _ = self.routing_site(fed)
        site_probs, routed = self.posterior(fed, out.client_logits[site])
        return site_probs, routed, _pick(out.class_probs, routed)

    def answer(self, fed, out):
        site_probs, routed, class_probs = self.decide(fed, out)
        score = None
        if fed.abstention is not None:
            site, _ = self.routing_site(fed)
            d = np.stack([fed.abstention.distance(i, f) for i, f in enumerate(out.features)])
            n = np.arange(routed.shape[0])
            score = np.minimum(d[site], d[routed, n])
        return self.result(fed, site_probs, routed, class_probs, score, out)

    def route(self, fed: TrainedFederation, views: list[torch.Tensor]) -> RouteResult:
        """Runs the routing site's model, then each chosen site's model on its scans only."""
        site, _ = self.routing_site(fed)
        probs, client, feats = fed.site_pass(site, views[site])
        site_probs, routed = self.posterior(fed, client)
        class_probs = probs.copy()
        distance = None if fed.abstention is None else fed.abstention.distance(site, feats)
        for k in np.unique(routed):
            if k == site:
                continue
            rows = np.flatnonzero(routed == k)
            k_probs, _, k_feats = fed.site_pass(int(k), views[k][rows])
            class_probs[rows] = k_probs
            if distance is not None:
                distance[rows] = np.minimum(
                    distance[rows], fed.abstention.distance(int(k), k_feats)
                )
        return self.result(fed, site_probs, routed, class_probs, distance, None)


class MajorityVoteRouter(Router):
    """Every site model votes; the site probabilities are each model's support for the winner.

    The answer is the vote; its class probabilities are the site models' mean probabilities.
    """

    name = "majority_vote"
    summary = "every site model answers (one pass each); the majority wins"

    def forward_passes(self, fed: TrainedFederation) -> int:
        return len(fed.sites)

    def decide(self, fed, out):
        winner = majority_vote(out.class_probs)
        n = winner.shape[0]
        support = out.class_probs[:, np.arange(n), winner].T  # (n, K)
        site_probs = support / np.clip(support.sum(axis=1, keepdims=True), 1e-12, None)
        return site_probs, site_probs.argmax(axis=1), out.class_probs.mean(axis=0)

    def predict(self, fed, answer, site_probs, out):
        """Each site votes at its own operating point (or its argmax without one); a tie goes
        to positive when the models' probabilities sit on average at or above their thresholds."""
        thresholds = fed.thresholds
        if thresholds is None or answer.shape[1] != 2:
            return majority_vote(out.class_probs)
        margin = out.class_probs[:, :, 1] - thresholds[:, None]  # (K, n)
        positive = (margin >= 0).sum(axis=0) * 2
        k = margin.shape[0]
        tie_break = margin.mean(axis=0) >= 0
        return np.where(positive > k, 1, np.where(positive < k, 0, tie_break)).astype(np.int64)


class MaxConfidenceRouter(Router):
    name = "max_confidence"
    summary = "the site model most confident in its own answer is chosen"

    def forward_passes(self, fed: TrainedFederation) -> int:
        return len(fed.sites)

    def decide(self, fed, out):
        confidence = out.class_probs.max(axis=2).T  # (n, K)
        site_probs = confidence / confidence.sum(axis=1, keepdims=True)
        routed = confidence.argmax(axis=1)
        return site_probs, routed, _pick(out.class_probs, routed)


ROUTERS: dict[str, type[Router]] = {
    r.name: r
    for r in (
        DensityRatioRouter,
        OnePassRouter,
        SoftRouter,
        MajorityVoteRouter,
        MaxConfidenceRouter,
    )
}


def one_pass_applies(fed: TrainedFederation) -> bool:
    """The one-pass router needs a routing site chosen at publish time (none when the sites
    share every weight but their target heads: density_ratio is one pass there already)."""
    return fed.routes and fed.routing is not None and fed.routing.one_pass_site is not None


def routers_for(fed: TrainedFederation) -> list[Router]:
    """Every router that applies to this federation (density ratio needs a client head)."""
    return [
        cls()
        for cls in ROUTERS.values()
        if (fed.routes or not cls.needs_client_head)
        and (cls is not OnePassRouter or one_pass_applies(fed))
    ]


def default_router(fed: TrainedFederation) -> Router:
    return DensityRatioRouter() if fed.routes else MajorityVoteRouter()


def make_router(name: str, fed: TrainedFederation) -> Router:
    if name == "auto":
        return default_router(fed)
    if name not in ROUTERS:
        raise ConfigError(f"unknown router {name!r}; choose auto or one of {sorted(ROUTERS)}")
    router = ROUTERS[name]()
    if router.needs_client_head and not fed.routes:
        raise ConfigError(
            f"router {name!r} needs a client head; this run ({fed.algorithm}) has none: "
            "use majority_vote or max_confidence"
        )
    return router
