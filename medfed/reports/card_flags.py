"""Per-site flags of the model card: a site whose test specificity CI lies wholly below the
operating rule's specificity target, and a site whose calibration slope is poor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medfed.core.operating_rule import OperatingRule

SLOPE_RANGE = (0.8, 1.25)
"""A calibration slope outside this range is flagged (1 is ideal; below, over-confident)."""

FLAG_RULES = (
    "missed target: the operating rule names a specificity target and the site's test "
    "specificity 95% CI (Wilson) lies wholly below it",
    f"poor calibration: the calibration slope (logistic regression of the outcome on the "
    f"logit) lies outside {SLOPE_RANGE[0]}-{SLOPE_RANGE[1]}",
)


def _target(rule: str | None) -> float | None:
    try:
        parsed = OperatingRule.parse(rule) if rule else None
    except ValueError:
        return None
    return parsed.value if parsed is not None and parsed.kind == "specificity" else None


def site_flags(sites: Mapping[str, Any], rule: str | None) -> list[str]:
    """One line per flagged site (``sites``: site name to its SiteFigures), naming the figure,
    its interval and the rule it breaks; empty when no site is flagged."""
    target = _target(rule)
    lines = []
    for site, figures in sites.items():
        op = getattr(figures, "operating_point", None)
        spec = op.specificity.interval if op is not None else None
        if target is not None and spec is not None and spec.high < target:
            lines.append(
                f"{site}: specificity at the operating point {spec.text()} (95% CI), "
                f"wholly below the target {target:.2f} of {rule}"
            )
        calibration = getattr(figures, "calibration", None)
        slope = calibration.slope if calibration is not None else None
        if slope is not None and not SLOPE_RANGE[0] <= slope <= SLOPE_RANGE[1]:
            ci = getattr(calibration, "slope_ci", None)
            shown = f"{slope:.2f}" + ("" if ci is None else f" ({ci[0]:.2f}-{ci[1]:.2f}, 95% CI)")
            lines.append(
                f"{site}: calibration slope {shown}, outside "
                f"{SLOPE_RANGE[0]}-{SLOPE_RANGE[1]} (over-confident below, timid above)"
            )
    return lines
