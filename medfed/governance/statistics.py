"""A statistics-only run as a site approves it: its settings, its plan, and the site policy's
rules applied to it.

A statistics run trains nothing and sends no weights: each site answers one message with its
data card's statistics (counts per split and class, image sizes, intensity histograms per
channel, acquisition devices), after suppressing every cell on fewer than ``min_count`` scans
and, when the run asks for it, adding differential-privacy noise to every count
(:mod:`medfed.governance.disclosure`). Its plan is a :class:`~medfed.governance.plan.Plan`
whose ``train`` table holds only ``statistics`` (these settings) and whose outputs are only
``data_card``; its hash is taken as for any plan, so a site approves it the same way.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from medfed import __version__
from medfed.core.errors import ConfigError
from medfed.governance.checks import Refusal, approval_refusals
from medfed.governance.plan import APP, Plan
from medfed.governance.policy import SitePolicy

STATISTICS_OUTPUTS = ("data_card",)
"""What a statistics run sends out of a site: its data card's statistics, nothing else."""
NOISE = ("none", "laplace", "gaussian")
"""How a statistics run noises its counts (``none``: min-count suppression only)."""
DEFAULT_DELTA = 1e-5


@dataclass(frozen=True)
class StatisticsSettings:
    """What a statistics run asks of each site.

    ``min_count``: cells on fewer scans are suppressed (a site's policy may ask for more: the
    larger applies); ``noise``: ``none``, ``laplace`` or ``gaussian`` noise on every released
    count; ``epsilon``: the privacy budget the noise spends per site, for all its tables together
    (``gaussian``: below 1, with ``delta``)."""

    min_count: int = 0
    noise: str = "none"
    epsilon: float = 0.0
    delta: float = 0.0

    def __post_init__(self) -> None:
        where = "statistics settings"
        if type(self.min_count) is not int or not 0 <= self.min_count < 2**63:
            raise ConfigError(f"{where}: min_count (--min-count) must be a whole number >= 0 "
                              f"(below 2**63), got {self.min_count!r}")  # fmt: skip
        if self.noise not in NOISE:
            raise ConfigError(f"{where}: noise {self.noise!r} is not one of {', '.join(NOISE)}")
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
            raise ConfigError(f"{where}: epsilon (--epsilon) must be a finite number, got {eps!r}")
        if self.noise == "none" and eps:
            raise ConfigError(
                f"{where}: epsilon {eps:g} without noise; choose --noise laplace or gaussian, "
                "or leave epsilon out"
            )
        if self.noise != "none" and eps <= 0:
            raise ConfigError(f"{where}: {self.noise} noise needs an epsilon > 0 (--epsilon)")
        if self.noise == "gaussian":
            if eps >= 1:
                raise ConfigError(
                    f"{where}: the Gaussian mechanism's bound holds for epsilon < 1, got "
                    f"{eps:g}; use a smaller epsilon or --noise laplace"
                )
            if not 0 < self.delta < 1:
                raise ConfigError(f"{where}: gaussian noise needs 0 < delta (--delta) < 1, got "
                                  f"{self.delta!r}")  # fmt: skip
        elif self.delta:
            raise ConfigError(f"{where}: delta is for gaussian noise only, got {self.delta!r}")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", float(self.delta))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "the statistics settings") -> StatisticsSettings:
        names = set(cls.__dataclass_fields__)
        if not isinstance(data, Mapping) or not set(data) <= names:
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(f"{where}: not medfed statistics settings (holds {got})")
        return cls(**data)

    def words(self) -> str:
        """The disclosure control in words."""
        floor = f"cells under {self.min_count} scans suppressed" if self.min_count else (
            "no minimum count from the run (each site's policy may set one)"
        )  # fmt: skip
        if self.noise == "none":
            return f"{floor}; no noise"
        delta = f", delta {self.delta:g}" if self.noise == "gaussian" else ""
        return f"{floor}; {self.noise} noise on every count, epsilon {self.epsilon:g}{delta}"


def make_statistics_plan(settings: StatisticsSettings, sites: list[str], *, run_name: str) -> Plan:
    """The plan of a statistics run."""
    return Plan(
        app=APP,
        version=__version__,
        run_name=run_name,
        sites=list(sites),
        train={"statistics": settings.to_json()},
        secure_aggregation=False,
        secure_bound=0.0,
        starting_sha256="",
        outputs=list(STATISTICS_OUTPUTS),
    )


def is_statistics_plan(plan: Plan) -> bool:
    return set(plan.train) == {"statistics"}


def statistics_settings(plan: Plan) -> StatisticsSettings:
    return StatisticsSettings.from_json(plan.train["statistics"], "the run plan's statistics")


def plan_lines(plan: Plan) -> list[str]:
    """Any plan in words, one line each (a statistics plan says what it sends)."""
    if not is_statistics_plan(plan):
        return plan.lines()
    return [
        f"plan sha256: {plan.sha256}",
        f"run: {plan.run_name} ({plan.app} {plan.version}), sites: {', '.join(plan.sites)}",
        "statistics only: no training, no weights",
        f"disclosure control: {statistics_settings(plan).words()}",
        f"leaves each site: {', '.join(plan.outputs)}",
    ]


def check_statistics_plan(
    policy: SitePolicy, plan: Plan, *, site: str | None = None, approved: Collection[str] = ()
) -> list[Refusal]:
    """Every rule of ``policy`` a statistics plan breaks ([]: the site takes part).

    The training rules (algorithms, backbones, rounds, starting weights) have nothing to apply
    to; the privacy rules apply to the noise on the counts, and ``min_count`` is honoured by
    the site itself (it suppresses more cells), so it refuses nothing."""
    try:
        settings = statistics_settings(plan)
    except ConfigError as exc:
        return [Refusal("plan", str(exc))]
    out: list[Refusal] = []
    if site is not None and policy.site is not None and site != policy.site:
        out.append(
            Refusal("site", f"the policy is for site {policy.site!r}, this node serves {site!r}")
        )
    for output in plan.outputs:
        if not policy.outputs.get(output, False):
            what = "the site's data card statistics (counts, sizes, histograms, devices)"
            out.append(Refusal(f"outputs.{output}", f"the statistics run sends {what}"))
    if policy.require_dp and settings.noise == "none":
        out.append(
            Refusal("privacy.require_dp", "the statistics run adds no differential-privacy noise")
        )
    if policy.max_epsilon is not None:
        if settings.noise == "none":
            why = "the statistics run adds no noise (epsilon unbounded)"
        elif settings.epsilon > policy.max_epsilon:
            why = f"the statistics run spends epsilon {settings.epsilon:g}"
        else:
            why = ""
        if why:
            out.append(Refusal("privacy.max_epsilon", f"{why}; at most {policy.max_epsilon:g}"))
    if policy.require_secure_aggregation:
        out.append(
            Refusal(
                "privacy.require_secure_aggregation",
                "the statistics run sends this site's counts to the coordinator in the clear",
            )
        )
    return out + approval_refusals(policy, plan, approved)
