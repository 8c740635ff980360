"""Method specs of ``medfed compare`` and the tables written into the README."""

from __future__ import annotations

import pytest

from medfed.errors import ConfigError
from medfed.experiments.demo import MethodSpec
from medfed.runs.report import (
    communication_table,
    federation_lines,
    methods_table,
    replace_marked_section,
    routers_table,
    site_table,
)
from medfed.runs.schema import Summary
from tests.test_schema import make_summary, site_figures


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


def summary(system: float, nbytes: float) -> Summary:
    return make_summary(
        system_accuracy=system,
        bytes_per_round=nbytes,
        routing_method="majority_vote",
        routing_accuracy=None,
    )


def test_communication_table_compares_with_the_baseline() -> None:
    table = communication_table(
        {"fedavg": summary(0.80, 4e6), "lora@int8": summary(0.795, 2e5)}, baseline="fedavg"
    )
    row = next(line for line in table.splitlines() if line.startswith("| lora@int8"))
    assert "20.0x" in row and "-0.5" in row and "0.200 MB" in row
    assert "| method" in methods_table({"fedavg": summary(0.8, 4e6)})


def test_evaluate_tables_show_each_site_the_federation_and_every_router() -> None:
    run = make_summary(sites={"a": site_figures(0.8), "b": site_figures(None)})

    sites = site_table(run)
    lines = federation_lines(run)
    routers = routers_table(run)

    row_b = next(line for line in sites.splitlines() if line.startswith("| b "))
    assert "n/a (test split holds one class)" in row_b and "1000.0 kB" in row_b
    assert "worst site: b" in lines and "system accuracy (density_ratio): 0.720" in lines
    assert "| majority_vote " in routers and "| density_ratio " in routers


def test_marked_sections_are_replaced_and_missing_markers_refused() -> None:
    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    assert (
        replace_marked_section(text, "t", "new") == "a\n<!-- t:start -->\nnew\n<!-- t:end -->\nb\n"
    )
    with pytest.raises(ValueError, match="markers"):
        replace_marked_section("no markers", "t", "new")
