"""Routing a scan to the site whose model fits it best.

FedDRM's density ratio: score_i = client_logit_i - log(pi_i), pi_i = n_i / N; the scan goes to
argmax_i score_i and that site's target head answers. Baselines without a client head answer by
majority vote of all site models (m forward passes instead of one).
"""

from __future__ import annotations

import numpy as np


def density_ratio_scores(client_logits: np.ndarray, priors: np.ndarray) -> np.ndarray:
    """client logit minus log prior, per site: (n, K) -> (n, K)."""
    priors = np.asarray(priors, dtype=np.float64)
    if priors.ndim != 1 or priors.shape[0] != client_logits.shape[1]:
        raise ValueError(
            f"priors has shape {priors.shape}, expected ({client_logits.shape[1]},) (one per site)"
        )
    if np.any(priors <= 0):
        raise ValueError("site priors must be > 0 (every site contributes training data)")
    return np.asarray(client_logits, dtype=np.float64) - np.log(priors)[None, :]


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
