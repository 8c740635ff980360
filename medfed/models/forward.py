"""The forward helper: a federated model's class probabilities, client logits and features."""

from __future__ import annotations

import numpy as np
import torch

from medfed.core.normalization import NormalizedView
from medfed.models.device import DeviceSetup
from medfed.models.fedmodel import FedModel

BATCH = 256


@torch.no_grad()
def run_model(
    model: FedModel, x: torch.Tensor | NormalizedView, setup: DeviceSetup, heads: list | None
) -> tuple[np.ndarray, np.ndarray | None, torch.Tensor]:
    """Class probabilities, client logits and backbone features of ``model`` on ``x``.

    With ``heads``, ``x`` holds len(heads) equal-sized blocks and block i uses head i. A
    :class:`NormalizedView` is normalized batch by batch, on the device.
    """
    model.eval()
    probs, clients, feats = [], [], []
    block = x.shape[0] // len(heads) if heads else x.shape[0]
    for start in range(0, x.shape[0], BATCH):
        xb = _batch(x, start, start + BATCH, setup.device)
        if setup.channels_last and xb.dim() == 4:
            xb = xb.contiguous(memory_format=torch.channels_last)
        with setup.autocast()():
            f = model.features(xb)
            hidden = model.target_branch(f)
            if heads is None:
                logits = model.target_head(hidden)
            else:
                owner = torch.arange(start, start + xb.shape[0], device=xb.device) // block
                logits = torch.stack([h(hidden) for h in heads])[owner, torch.arange(len(xb))]
            client = None
            if model.client_branch is not None and model.client_head is not None:
                client = model.client_head(model.client_branch(model.client_features(xb, f)))
        probs.append(torch.softmax(logits.float(), dim=1).cpu())
        feats.append(f.float().cpu())
        if client is not None:
            clients.append(client.float().cpu())
    p = torch.cat(probs).numpy().astype(np.float64)
    c = torch.cat(clients).numpy().astype(np.float64) if clients else None
    return p, c, torch.cat(feats)


def _batch(x: torch.Tensor | NormalizedView, start: int, stop: int, device: torch.device):
    """Rows ``start:stop`` of ``x`` on ``device``; a view's rows travel in their storage dtype
    and are normalized there."""
    if isinstance(x, NormalizedView):
        return x.normalization.apply(x.stored[start:stop].to(device))
    return x[start:stop].to(device)
