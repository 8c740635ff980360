"""A site's governance of a deployed run: its policy (what may run on its data and what may
leave), the run's plan and its hash (what the site's operator approves), the checks of one
against the other, and the site's approvals and audit log.

* :mod:`~medfed.governance.policy`: the site policy TOML file, parsed with an error per key
* :mod:`~medfed.governance.plan`: a deployed run's plan and its sha256
* :mod:`~medfed.governance.checks`: every rule a plan breaks, each named
* :mod:`~medfed.governance.records`: the site's approvals and audit log (append-only)

No PyTorch here: a SuperNode decides on a message before anything heavy is loaded.
"""

from medfed.governance.checks import Refusal, check_plan
from medfed.governance.plan import Plan, make_plan, plan_sha256
from medfed.governance.policy import PolicyError, SitePolicy, load_policy, parse_policy

__all__ = [
    "Plan",
    "PolicyError",
    "Refusal",
    "SitePolicy",
    "check_plan",
    "load_policy",
    "make_plan",
    "parse_policy",
    "plan_sha256",
]
