"""FedAvg + local fine-tuning: train one global model, then each site fine-tunes it locally."""

from __future__ import annotations

from dataclasses import dataclass

from medfed.algorithms.base import Algorithm, Params


@dataclass(frozen=True)
class FedAvgFTParams(Params):
    finetune_rounds: int = 2  # fine-tuning budget, in rounds' worth of local steps
    non_negative = ("finetune_rounds",)


class FedAvgFT(Algorithm):
    name = "fedavgft"
    summary = "FedAvg, then each site fine-tunes the global model on its own data"
    params_class = FedAvgFTParams

    def finetune_steps(self, local_steps: int) -> int:
        return self.params.finetune_rounds * local_steps
