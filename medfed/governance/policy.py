"""A site's policy: what may run on its data and what may leave its network.

The site's operator keeps it as a TOML file beside the site's manifest and names it in the
SuperNode's node config (``policy="/path/to/policy.toml"``). Every key is optional; a policy
that says nothing about a rule leaves it open, except approval, which a policy requires unless
it says ``required = false``::

    site = "acrima"                       # the manifest's id (checked when given)

    [allow]
    algorithms = ["fedavg", "feddrm"]     # any, when absent
    backbones = ["cnn-gn", "resnet18-gn"] # any, when absent (auto is resolved first)
    max_rounds = 50
    max_local_steps = 200

    [privacy]
    require_dp = true                     # the run must train with DP-SGD
    max_epsilon = 8.0                     # the largest epsilon a run may spend (implies DP)
    require_secure_aggregation = false

    [weights]
    starting = ["<sha256>", ...]          # the starting weights must be one of these

    [outputs]                             # what may leave the site (true: allowed)
    updates = true                        # model weights or their updates
    figures = true                        # aggregate figures (AUC, counts, sums, calibration)
    predictions = false                   # each test scan's prediction (a run sends them only
                                          # when it asks: run config predictions="coordinator")
    data_card = true                      # the site's description and counts
    min_count = 10                        # count cells on fewer scans (and the figures read
                                          # off them, the ROC curve always) are withheld from
                                          # what leaves; 0: none (the default)

    [approval]
    required = true                       # train only on an approved plan
    plans = ["<plan sha256>", ...]        # approved here, besides 'medfed deploy approve'

Parsing refuses an unknown table or key, a value of the wrong kind, and a name in an
allow-list that is no algorithm or backbone of medfed, naming the file, the key and what to
write instead.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medfed.core.errors import ConfigError
from medfed.governance.names import ALGORITHMS, BACKBONES, unknown_name

OUTPUTS = ("updates", "figures", "predictions", "data_card")
"""What a run can send out of a site, as a policy's [outputs] table names it."""

SHA256 = re.compile(r"[0-9a-f]{64}")

_TABLES: dict[str, tuple[str, ...]] = {
    "allow": ("algorithms", "backbones", "max_rounds", "max_local_steps"),
    "privacy": ("require_dp", "max_epsilon", "require_secure_aggregation"),
    "weights": ("starting",),
    "outputs": (*OUTPUTS, "min_count"),
    "approval": ("required", "plans"),
}


class PolicyError(ConfigError):
    """A site policy file is unusable (not TOML, an unknown key, a value of the wrong kind)."""


@dataclass(frozen=True)
class SitePolicy:
    """A site's rules (None: the policy leaves that rule open)."""

    path: str = ""
    site: str | None = None
    algorithms: tuple[str, ...] | None = None
    backbones: tuple[str, ...] | None = None
    max_rounds: int | None = None
    max_local_steps: int | None = None
    require_dp: bool = False
    max_epsilon: float | None = None
    require_secure_aggregation: bool = False
    starting: tuple[str, ...] | None = None
    outputs: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(OUTPUTS, True))
    min_count: int = 0
    approval_required: bool = True
    approved_plans: tuple[str, ...] = ()


def load_policy(path: str | Path) -> SitePolicy:
    """The policy in ``path`` (PolicyError names the file and the key at fault)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise PolicyError(f"site policy {path}: a folder; give the policy's TOML file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(
            f"site policy {path}: no such file; write it (docs/deployment.md, 'Site policy') "
            "or correct policy= in the SuperNode's --node-config"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"site policy {path}: cannot be read ({exc})") from None
    return parse_policy(text, str(path))


def parse_policy(text: str, where: str) -> SitePolicy:
    """The policy in TOML ``text``; ``where`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"site policy {where}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - {"site", "schema_version", *_TABLES})
    if unknown:
        raise PolicyError(
            f"site policy {where}: unknown key or table {unknown[0]!r}; a policy holds 'site' "
            f"and the tables {', '.join(f'[{t}]' for t in _TABLES)}"
        )
    tables: dict[str, Mapping[str, Any]] = {}
    for name, keys in _TABLES.items():
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise PolicyError(f"site policy {where}: '{name}' must be a table ([{name}])")
        extra = sorted(set(table) - set(keys))
        if extra:
            raise PolicyError(
                f"site policy {where}: unknown key {name}.{extra[0]}; [{name}] holds "
                f"{', '.join(keys)}"
            )
        tables[name] = table
    reader = _Reader(where)
    allow, privacy, outputs = tables["allow"], tables["privacy"], tables["outputs"]
    return SitePolicy(
        path=where,
        site=reader.text(data, "site") if "site" in data else None,
        algorithms=reader.names(allow, "allow.algorithms", ALGORITHMS, "algorithm"),
        backbones=reader.names(allow, "allow.backbones", BACKBONES, "backbone"),
        max_rounds=reader.count(allow, "allow.max_rounds"),
        max_local_steps=reader.count(allow, "allow.max_local_steps"),
        require_dp=reader.flag(privacy, "privacy.require_dp", False),
        max_epsilon=reader.epsilon(privacy, "privacy.max_epsilon"),
        require_secure_aggregation=reader.flag(
            privacy, "privacy.require_secure_aggregation", False
        ),
        starting=reader.hashes(tables["weights"], "weights.starting"),
        outputs={k: reader.flag(outputs, f"outputs.{k}", True) for k in OUTPUTS},
        min_count=reader.count(outputs, "outputs.min_count", zero=True) or 0,
        approval_required=reader.flag(tables["approval"], "approval.required", True),
        approved_plans=reader.hashes(tables["approval"], "approval.plans") or (),
    )


class _Reader:
    """Reads one key of a table, refusing a value of the wrong kind by its dotted name."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _bad(self, key: str, value: Any, expected: str) -> PolicyError:
        return PolicyError(f"site policy {self.where}: {key} = {value!r}; expected {expected}")

    def text(self, data: Mapping[str, Any], key: str) -> str:
        value = data[key]
        if not isinstance(value, str) or not value.strip():
            raise self._bad(key, value, "a site id in quotes")
        return value

    def names(
        self, table: Mapping[str, Any], key: str, known: tuple[str, ...], what: str
    ) -> tuple[str, ...] | None:
        value = table.get(key.split(".")[1])
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self._bad(key, value, f'a list of names, e.g. ["{known[1]}", "{known[2]}"]')
        for name in value:
            why = unknown_name(name, known, what)
            if why is not None:
                raise PolicyError(f"site policy {self.where}: {key}: {why}")
        return tuple(value)

    def count(self, table: Mapping[str, Any], key: str, *, zero: bool = False) -> int | None:
        value = table.get(key.split(".")[1])
        if value is None:
            return None
        if type(value) is not int or value < (0 if zero else 1):
            raise self._bad(key, value, f"a whole number of at least {0 if zero else 1}")
        return value

    def flag(self, table: Mapping[str, Any], key: str, default: bool) -> bool:
        value = table.get(key.split(".")[1], default)
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def epsilon(self, table: Mapping[str, Any], key: str) -> float | None:
        value = table.get(key.split(".")[1])
        if value is None:
            return None
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:
            raise self._bad(key, value, "a number > 0 (the largest epsilon a run may spend)")
        return float(value)

    def hashes(self, table: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
        value = table.get(key.split(".")[1])
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(v, str) and SHA256.fullmatch(v) for v in value
        ):
            raise self._bad(key, value, "a list of sha256 hashes (64 lower-case hex digits)")
        return tuple(value)
