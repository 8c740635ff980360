"""Sharing schedules: in which rounds which of an algorithm's shared keys travel.

A schedule composes with any algorithm: the algorithm decides what may leave a site (its
sharing rule) and what it needs in a round; the schedule only thins that per round. FedALS is
the :class:`Alternating` schedule (the head every round, the representation every alpha rounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from medfed.core.errors import ConfigError
from medfed.models.fedmodel import keys_with_prefix


class Schedule(Protocol):
    spelling: str | None  # the algorithm name a run with this schedule records (fedals)

    def select(self, shared: list[str], own: list[str], round_: int, rounds: int) -> list[str]:
        """Of ``own`` (the keys the algorithm needs this round), those that travel."""
        ...

    def check(self, shared: list[str]) -> None:
        """Refuse a schedule that cannot apply to these shared keys."""
        ...

    def params(self) -> dict[str, Any]:
        """The schedule's settings, for config.toml."""
        ...


class EveryRound:
    """Everything the algorithm shares travels every round."""

    spelling = None

    def select(self, shared: list[str], own: list[str], round_: int, rounds: int) -> list[str]:
        return own

    def check(self, shared: list[str]) -> None:
        return None

    def params(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class Alternating:
    """FedALS: the representation (keys under ``prefixes``) travels only every ``alpha`` rounds
    and in the last one; every other shared key (the head) travels every round."""

    alpha: int
    prefixes: tuple[str, ...]
    spelling = "fedals"

    def select(self, shared: list[str], own: list[str], round_: int, rounds: int) -> list[str]:
        if round_ % self.alpha == 0 or round_ == rounds:
            return own
        representation = keys_with_prefix(shared, self.prefixes)
        return [k for k in own if k not in representation]

    def check(self, shared: list[str]) -> None:
        representation = keys_with_prefix(shared, self.prefixes)
        if not representation:
            raise ConfigError(
                f"fedals: no shared key starts with {list(self.prefixes)}, so there is no "
                "representation to send less often; set --param representation= to module "
                "prefixes of what this algorithm shares (e.g. backbone, client_branch)"
            )
        if len(representation) == len(shared):
            raise ConfigError(
                f"fedals: every shared key is under {list(self.prefixes)}, so no head would "
                "travel every round; name a narrower representation"
            )

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "representation": ",".join(self.prefixes)}
