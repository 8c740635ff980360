"""Operating rules: how a threshold is picked on a validation split, as text a setting holds.

Only the rule's spelling lives here (no numpy or scipy), so that the settings can check an
``--operating-point`` at once; :mod:`medfed.metrics` picks thresholds by it.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_OPERATING_RULE = "specificity:0.90"

RULE_FORMS = (
    "'specificity:S' with 0 < S < 1 (e.g. specificity:0.90), 'youden', "
    "or 'threshold:T' with 0 <= T <= 1 (e.g. threshold:0.5)"
)


@dataclass(frozen=True)
class OperatingRule:
    """How to pick a threshold on the validation split.

    ``specificity`` (``value`` the target specificity in (0, 1)): the lowest threshold whose
    validation specificity reaches the target, that is the most sensitive one;
    ``youden``: the threshold maximising sensitivity + specificity - 1; ``threshold``
    (``value`` in [0, 1]): a fixed threshold.
    """

    kind: str
    value: float | None = None

    def __post_init__(self) -> None:
        if self.kind == "youden":
            if self.value is not None:
                raise ValueError(f"operating rule 'youden' takes no value; accepted: {RULE_FORMS}")
            return
        if self.kind not in ("specificity", "threshold"):
            raise ValueError(f"unknown operating rule kind {self.kind!r}; accepted: {RULE_FORMS}")
        if self.value is None or isinstance(self.value, bool):
            raise ValueError(f"operating rule {self.kind!r} needs a value; accepted: {RULE_FORMS}")
        value = float(self.value)
        ok = (0 < value < 1) if self.kind == "specificity" else (0 <= value <= 1)
        if not ok:  # NaN fails both comparisons
            raise ValueError(
                f"operating rule {self.kind}:{value} is out of range; accepted: {RULE_FORMS}"
            )
        object.__setattr__(self, "value", value)

    @classmethod
    def parse(cls, text: str) -> OperatingRule:
        """``specificity:0.90``, ``youden`` or ``threshold:0.5`` (case and spaces ignored)."""
        if not isinstance(text, str):
            raise ValueError(f"operating rule must be text; got {text!r}; accepted: {RULE_FORMS}")
        kind, sep, rest = (part.strip() for part in text.strip().lower().partition(":"))
        if kind == "youden" and not sep:
            return cls("youden")
        if kind in ("specificity", "threshold") and sep:
            try:
                value = float(rest)
            except ValueError:
                value = None
            if value is not None:
                return cls(kind, value)
        raise ValueError(f"operating rule {text!r} not understood; accepted: {RULE_FORMS}")

    def __str__(self) -> str:
        """The rule as ``parse`` reads it: values with at least two decimals, more where
        needed to read back exactly (``specificity:0.90``, ``specificity:0.925``)."""
        if self.value is None:
            return self.kind
        short = f"{self.value:.2f}"
        return f"{self.kind}:{short if float(short) == self.value else repr(self.value)}"
