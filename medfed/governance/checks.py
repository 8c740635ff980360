"""A site's policy against a run's plan: every rule the plan breaks, each named.

A SuperNode asks this before it reads any of its data (the run's first message carries the
plan), and again on every later message, against the settings the message carries; ``medfed
deploy policy check`` asks it for an operator before the run is submitted.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from medfed.governance.plan import Plan
from medfed.governance.policy import SitePolicy


@dataclass(frozen=True)
class Refusal:
    """One broken rule: its dotted name in the policy file, and why the plan breaks it."""

    rule: str
    reason: str

    def text(self) -> str:
        return f"refused by the site's policy, rule {self.rule}: {self.reason}"

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "reason": self.reason}


def check_plan(
    policy: SitePolicy,
    plan: Plan,
    *,
    site: str | None = None,
    approved: Collection[str] = (),
    backbone: str | None = None,
) -> list[Refusal]:
    """Every rule of ``policy`` that ``plan`` breaks ([]: the site may take part).

    ``site``: the manifest's id (checked against the policy's ``site``); ``approved``: plan
    hashes the operator approved besides those the policy lists; ``backbone``: the backbone
    the run resolved (before the sites are known, ``auto`` is not checked against
    ``allow.backbones``)."""
    out: list[Refusal] = []
    if site is not None and policy.site is not None and site != policy.site:
        out.append(
            Refusal("site", f"the policy is for site {policy.site!r}, this node serves {site!r}")
        )
    out += _allowed(policy, plan, backbone)
    out += _privacy(policy, plan)
    if policy.starting is not None and plan.starting_sha256 not in policy.starting:
        start = plan.starting_sha256 or "a random start (no starting weights)"
        out.append(Refusal("weights.starting", f"the run starts from {start}, not a listed hash"))
    for output in plan.outputs:
        if not policy.outputs.get(output, False):
            out.append(Refusal(f"outputs.{output}", f"the run sends {_OUTPUT_WORDS[output]}"))
    # outputs.min_count refuses nothing: the site withholds every figure on fewer scans from
    # what it sends (medfed.routing.evaluation.suppress_small).
    return out + approval_refusals(policy, plan, approved)


def approval_refusals(policy: SitePolicy, plan: Plan, approved: Collection[str]) -> list[Refusal]:
    """``approval.required`` when the policy asks for approval and the plan's hash is neither
    in the policy's list nor among those the operator approved (``approved``)."""
    sha = plan.sha256
    if not policy.approval_required or sha in policy.approved_plans or sha in approved:
        return []
    return [
        Refusal(
            "approval.required",
            f"plan {sha} was not approved at this site; its operator approves it with "
            "'medfed deploy approve --run APP --state-dir DIR' or lists it in [approval] plans",
        )
    ]


_OUTPUT_WORDS = {
    "updates": "model weights (the shared part of each round's update) to the coordinator",
    "figures": "aggregate figures (validation and test figures) to the coordinator",
    "predictions": "each test scan's prediction and score to the coordinator",
    "data_card": "the site's description (label map, input shape, training count, manifest)",
}


def _allowed(policy: SitePolicy, plan: Plan, backbone: str | None) -> list[Refusal]:
    config = plan.config
    out = []
    if policy.algorithms is not None and config.algorithm not in policy.algorithms:
        out.append(
            Refusal(
                "allow.algorithms",
                f"the run trains {config.algorithm!r}; allowed: {', '.join(policy.algorithms)}",
            )
        )
    chosen = backbone or config.backbone
    if policy.backbones is not None and chosen != "auto" and chosen not in policy.backbones:
        out.append(
            Refusal(
                "allow.backbones",
                f"the run's backbone is {chosen!r}; allowed: {', '.join(policy.backbones)}",
            )
        )
    if policy.max_rounds is not None and config.rounds > policy.max_rounds:
        out.append(
            Refusal(
                "allow.max_rounds",
                f"the run has {config.rounds} rounds, more than {policy.max_rounds}",
            )
        )
    if policy.max_local_steps is not None and config.local_steps > policy.max_local_steps:
        out.append(
            Refusal(
                "allow.max_local_steps",
                f"the run takes {config.local_steps} local steps a round, more than "
                f"{policy.max_local_steps}",
            )
        )
    return out


def _privacy(policy: SitePolicy, plan: Plan) -> list[Refusal]:
    config = plan.config
    out = []
    if policy.require_dp and not config.dp.enabled:
        out.append(Refusal("privacy.require_dp", "the run trains without differential privacy"))
    if policy.max_epsilon is not None:
        most = policy.max_epsilon
        if not config.dp.enabled:
            why = (
                "the run trains without differential privacy (epsilon unbounded; at most "
                f"{most:g} allowed)"
            )
        elif config.dp_epsilon <= 0:
            why = (
                "the run gives a noise level but no budget, so its epsilon is not bounded by "
                f"{most:g}"
            )
        elif config.dp_epsilon > most:
            why = f"the run may spend epsilon {config.dp_epsilon:g}, more than {most:g}"
        else:
            why = ""
        if why:
            out.append(Refusal("privacy.max_epsilon", why))
    if policy.require_secure_aggregation and not plan.secure_aggregation:
        out.append(
            Refusal(
                "privacy.require_secure_aggregation",
                "the run aggregates in the clear (the coordinator would see this site's update)",
            )
        )
    return out
