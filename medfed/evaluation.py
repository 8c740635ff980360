"""Evaluate a trained federation: per-site figures, federation figures, system accuracy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from medfed.federation.device import DeviceSetup
from medfed.metrics import (
    federation_metrics,
    majority_vote,
    routing_accuracy,
    site_metrics,
    system_accuracy,
)
from medfed.models.fedmodel import FedModel
from medfed.routing import route_density_ratio

State = dict[str, torch.Tensor]
EVAL_BATCH = 256


@dataclass
class Prediction:
    probs: np.ndarray  # (n, n_classes)
    client_logits: np.ndarray | None  # (n, n_sites) when the model has a client head


@torch.no_grad()
def predict(model: FedModel, state: State, x: torch.Tensor, setup: DeviceSetup) -> Prediction:
    """Class probabilities (and client logits) of ``model`` loaded with ``state`` on ``x``."""
    model.load_state_dict(state)
    model.eval()
    probs, clients = [], []
    for start in range(0, x.shape[0], EVAL_BATCH):
        xb = x[start : start + EVAL_BATCH].to(setup.device)
        with setup.autocast()():
            out = model(xb)
        probs.append(torch.softmax(out.target_logits.float(), dim=1).cpu())
        if out.client_logits is not None:
            clients.append(out.client_logits.float().cpu())
    n_classes = model.target_head.out_features
    p = torch.cat(probs).numpy() if probs else np.zeros((0, n_classes), np.float32)
    c = torch.cat(clients).numpy() if clients else None
    return Prediction(p.astype(np.float64), None if c is None else c.astype(np.float64))


def system_figures(
    site_preds: list[list[Prediction]],
    labels: list[np.ndarray],
    priors: np.ndarray | None,
) -> dict[str, Any]:
    """Pool every site's test scans and answer each as the federation would.

    ``site_preds[j][i]`` is site model i on site j's scans. With ``priors`` (a client head exists),
    route by density ratio and answer with the routed site's model; otherwise majority vote.
    """
    y = np.concatenate(labels)
    true_site = np.concatenate([np.full(len(lab), j) for j, lab in enumerate(labels)])
    m = len(site_preds[0])
    stacked = np.stack(
        [np.concatenate([site_preds[j][i].probs for j in range(len(labels))]) for i in range(m)]
    )  # (m models, n scans, n classes)
    if priors is not None:
        client = np.concatenate([site_preds[j][0].client_logits for j in range(len(labels))])
        _, routed = route_density_ratio(client, priors)
        answer = stacked[routed, np.arange(len(y))].argmax(axis=1)
        return {
            "routing_method": "density_ratio",
            "system_accuracy": system_accuracy(y, answer),
            "routing_accuracy": routing_accuracy(true_site, routed),
            "n_pooled": int(len(y)),
        }
    return {
        "routing_method": "majority_vote",
        "system_accuracy": system_accuracy(y, majority_vote(stacked)),
        "routing_accuracy": None,
        "n_pooled": int(len(y)),
    }


def per_site_figures(site_ids: list[str], own_preds: list[Prediction], labels: list[np.ndarray]):
    """Each site's model on its own split, plus the federation figures across sites."""
    per_site = {
        sid: site_metrics(lab, pred.probs)
        for sid, pred, lab in zip(site_ids, own_preds, labels, strict=True)
    }
    return per_site, federation_metrics(per_site)
