"""FedAvg: every key travels; the sample-weighted mean becomes the next global model."""

from __future__ import annotations

from medfed.algorithms.base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "one global model; all weights averaged with weights n_i/N"
