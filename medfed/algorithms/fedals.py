"""FedALS: aggregate the head every round (every H local steps) and the representation only
every alpha rounds (every alpha*H steps), around any base algorithm.

``fedals`` is the documented spelling of "a base algorithm with the alternating schedule"
(:class:`~medfed.algorithms.schedule.Alternating`): ``make_algorithm("fedals", {"base":
"feddrm", "alpha": 5, "lam": 0.9})`` builds FedDRM with lam=0.9 and that schedule. The
representation is the set of shared keys under the given module prefixes (the backbone by
default); every other shared key is "head" and travels every round, so with FedDRM the client
branch and head travel every round while FedDRM's private target head never does.
"""

from __future__ import annotations

from dataclasses import dataclass

from medfed.algorithms.base import Algorithm, Params
from medfed.algorithms.schedule import Alternating


@dataclass(frozen=True)
class FedALSParams(Params):
    base: str = "fedavg"
    alpha: int = 5
    representation: str = "backbone"  # comma-separated module prefixes

    def __post_init__(self) -> None:
        if self.alpha < 1:
            raise ValueError("alpha must be >= 1")
        if self.base == "fedals":
            raise ValueError("base cannot be fedals itself")
        if not self.prefixes:
            raise ValueError("representation must name at least one module prefix")

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip().rstrip(".") for p in self.representation.split(",") if p.strip())

    def schedule(self) -> Alternating:
        return Alternating(self.alpha, self.prefixes)


class FedALS(Algorithm):
    """Registry entry only: :func:`medfed.algorithms.make_algorithm` turns ``fedals`` into its
    base algorithm with the alternating schedule; it is never trained as itself."""

    name = "fedals"
    summary = "any base algorithm; head every round, representation every alpha rounds"
    params_class = FedALSParams
