"""Method specs of ``medfed compare`` and the tables written into the README."""

from __future__ import annotations

import pytest

from medfed.errors import ConfigError
from medfed.experiments.demo import MethodSpec
from medfed.runs.report import communication_table, methods_table, replace_marked_section


def test_method_specs_parse_parameters_and_wire_options() -> None:
    spec = MethodSpec.parse("fedals:base=feddrm,alpha=5@int8+delta")
    assert (spec.algorithm, spec.params) == ("fedals", {"base": "feddrm", "alpha": "5"})
    assert (spec.wire_precision, spec.wire_delta) == ("int8", True)
    plain = MethodSpec.parse("fedavg")
    assert (plain.params, plain.wire_precision, plain.wire_delta) == ({}, "float32", False)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        MethodSpec.parse("fedprox:mu")
    with pytest.raises(ConfigError, match="delta"):
        MethodSpec.parse("fedavg@int8+zip")


def summary(system: float, nbytes: float) -> dict:
    site = {"auc": 0.8, "accuracy": 0.7, "balanced_accuracy": 0.7, "n_test": 10}
    return {
        "sites": {"a": site, "b": site},
        "worst_site_auc": 0.8,
        "mean_site_auc": 0.8,
        "average_accuracy": 0.7,
        "system_accuracy": system,
        "routing_method": "majority_vote",
        "routing_accuracy": None,
        "bytes_per_round": nbytes,
    }


def test_communication_table_compares_with_the_baseline() -> None:
    table = communication_table(
        {"fedavg": summary(0.80, 4e6), "lora@int8": summary(0.795, 2e5)}, baseline="fedavg"
    )
    row = next(line for line in table.splitlines() if line.startswith("| lora@int8"))
    assert "20.0x" in row and "-0.5" in row and "0.200 MB" in row
    assert "| method" in methods_table({"fedavg": summary(0.8, 4e6)})


def test_marked_sections_are_replaced_and_missing_markers_refused() -> None:
    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    assert (
        replace_marked_section(text, "t", "new") == "a\n<!-- t:start -->\nnew\n<!-- t:end -->\nb\n"
    )
    with pytest.raises(ValueError, match="markers"):
        replace_marked_section("no markers", "t", "new")
