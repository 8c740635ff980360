"""The run directory's typed, versioned schema: summary.json, metrics.jsonl and the other files,
written and read through RunDir, without torch."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import pytest

from medfed.core.errors import RunDirError
from medfed.metrics import (
    FederationMetrics,
    Interval,
    calibration,
    operating_point,
    pooled_auc,
    wilson,
)
from medfed.runs import SCHEMA_VERSION, RunDir, read_json, schema, write_json
from medfed.runs.fields import Record, slots
from medfed.runs.schema import (
    Dropout,
    Evaluation,
    RoundRecord,
    RunCosts,
    SiteTraffic,
    Summary,
    Validation,
    WireSettings,
)
from tests.oldruns import before_intervals


def site_figures(auc: float | None = 0.8, n_test: int = 10) -> dict[str, Any]:
    return {
        "auc": auc,
        "auc_reason": None if auc is not None else "test split holds one class",
        "accuracy": 0.7,
        "balanced_accuracy": 0.65,
        "n_test": n_test,
        "n_train": 40,
        "n_val": 8,
        "roc": {"fpr": [0.0, 0.5, 1.0], "tpr": [0.0, 0.8, 1.0], "thresholds": [None, 0.6, 0.1]}
        | {"reason": None},
        **CLINICAL_SITE_FIGURES,
    }


_Y = [0, 0, 0, 1, 1, 0, 1, 1, 0, 1]
_P = [0.1, 0.3, 0.6, 0.7, 0.4, 0.2, 0.9, 0.8, 0.5, 0.65]
CLINICAL_SITE_FIGURES: dict[str, Any] = {
    "n_pos": 5,
    "n_neg": 5,
    "unreliable": "fewer than 10 positives (5)",
    "auc_ci": Interval(0.8, 0.6, 0.95, "DeLong").to_dict(),
    "operating_point": operating_point(_Y, _P, 0.55, "specificity:0.90").to_dict(),
    "calibration": calibration(_Y, _P, bins=2).to_dict(),
}


def router(system: float, routing: float | None) -> dict[str, Any]:
    return {
        "system_accuracy": system,
        "routing_accuracy": routing,
        "abstain_rate": 0.05,
        "answered_accuracy": system + 0.01,
        "forward_passes": 1 if routing is not None else 2,
        "latency_ms_per_scan": 1.5,
        "n_pooled": 20,
        "rates": {"system_accuracy": wilson(round(20 * system), 20).to_dict()},
    }


def summary_dict(**changes: Any) -> dict[str, Any]:
    """summary.json as medfed writes it (every key, as Coordinator.summary builds it)."""
    data = {
        "algorithm": "feddrm",
        "params": {"lam": 0.8, "private_norms": True},
        "rounds": 3,
        "local_steps": 2,
        "seed": 0,
        "backbone": "cnn",
        "modality": "fundus",
        "device": "cpu (float32)",
        "sites": {"a": site_figures(0.8), "b": site_figures(0.7, n_test=12)},
        "n_sites": 2,
        "mean_site_auc": 0.75,
        "worst_site_auc": 0.7,
        "worst_site": "b",
        "best_site_auc": 0.8,
        "best_site": "a",
        "auc_std": 0.05,
        "worst10_auc": 0.7,
        "auc_gini": 0.033,
        "average_accuracy": 0.7,
        "mean_accuracy": 0.7,
        "accuracy_std": 0.0,
        "sites_without_auc": [],
        "routing_method": "density_ratio",
        "system_accuracy": 0.72,
        "routing_accuracy": 0.9,
        "abstain_rate": 0.05,
        "routers": {
            "density_ratio": router(0.72, 0.9),
            "majority_vote": router(0.69, None),
        },
        "priors": {"a": 0.5, "b": 0.5},
        "bytes_per_round": 4e6,
        "bytes_per_round_by_site": {"a": {"up": 1e6, "down": 1e6}, "b": {"up": 1e6, "down": 1e6}},
        "wire": {"precision": "float32", "delta": False},
        "seconds_per_round": 0.25,
        "seconds_total": 0.75,
        "dropouts": 1,
        "dropped": [{"round": 2, "site": "b", "reason": "timed out"}],
        "skipped_rounds": [],
        "resumes": 0,
        "average_accuracy_by_train": 0.71,
        "pooled_auc": pooled_auc([0.8, 0.7], [0.004, 0.006]).to_dict(),
        "worst_site_auc_ci": CLINICAL_SITE_FIGURES["auc_ci"],
        "cross_site": {
            m: {d: {"auc": 0.7, "auc_reason": None, "accuracy": 0.6, "n": 10} for d in "ab"}
            for m in "ab"
        },
        "routers_origin_known": {"density_ratio": router(0.75, 0.9)},
        "system_by_site": {
            "origin_unknown": {"a": wilson(7, 10).to_dict(), "b": wilson(8, 12).to_dict()},
            "origin_known": {"a": wilson(8, 10).to_dict(), "b": wilson(9, 12).to_dict()},
        },
        "normalization": "site",
        "augment": "flip",
        "operating_rule": "specificity:0.90",
        # Each site right on 8 of its operating point's 10 scans, weighted by test scans, then
        # by training scans.
        "average_accuracy_operating": (0.8 * 10 + 0.8 * 12) / 22,
        "average_accuracy_operating_by_train": (0.8 * 40 + 0.8 * 40) / 80,
    }
    if "sites" in changes:  # other sites: their averages are read from them
        data = {k: v for k, v in data.items() if k not in OPERATING_AVERAGES}
    return data | changes


OPERATING_AVERAGES = ("average_accuracy_operating", "average_accuracy_operating_by_train")


def make_summary(**changes: Any) -> Summary:
    return Summary.from_dict(summary_dict(**changes))


# ---------------------------------------------------------------------------- summary.json
def test_summary_keeps_every_key_and_value_of_summary_json() -> None:
    data = summary_dict()
    summary = Summary.from_dict(copy.deepcopy(data))

    assert summary.to_dict() == data
    assert summary.sites["b"].n_test == 12 and summary.sites["a"].roc is not None
    assert summary.sites["a"].roc.thresholds == [None, 0.6, 0.1]
    assert summary.routers["majority_vote"].routing_accuracy is None
    assert summary.bytes_per_round_by_site["a"] == SiteTraffic(up=1e6, down=1e6)
    assert summary.wire == WireSettings("float32", False)
    assert summary.dropped == [Dropout(2, "b", "timed out")]
    assert "engine" not in summary.to_dict()  # only a Flower deployment writes it
    assert summary.sites["a"].operating_point.threshold == 0.55
    assert summary.pooled_auc.low < summary.pooled_auc.estimate < summary.pooled_auc.high
    assert summary.routers["density_ratio"].rates["system_accuracy"].k == 14


def test_a_summary_written_before_confidence_intervals_still_reads() -> None:
    summary = Summary.from_dict(before_intervals(summary_dict()))

    assert summary.sites["a"].auc_ci is None and summary.sites["a"].operating_point is None
    assert summary.pooled_auc is None and summary.routers_origin_known == {}
    assert summary.normalization == "site" and summary.routers["density_ratio"].rates == {}


def test_a_malformed_interval_is_named_by_its_key() -> None:
    data = summary_dict()
    data["sites"]["a"]["auc_ci"] = {"estimate": 0.8}
    with pytest.raises(RunDirError, match="auc_ci"):
        Summary.from_dict(data)


def test_summary_json_carries_the_schema_version_and_reads_back(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    summary = make_summary()

    run.write_summary(summary)

    on_disk = json.loads(run.summary_path.read_text())
    assert on_disk["schema_version"] == SCHEMA_VERSION
    assert {k: v for k, v in on_disk.items() if k != "schema_version"} == summary_dict()
    assert run.read_summary() == summary


def test_write_summary_accepts_a_plain_dict_and_checks_it(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.write_summary(summary_dict())
    assert run.read_summary() == make_summary()

    broken = summary_dict()
    del broken["seed"]
    with pytest.raises(RunDirError, match="summary to write.*missing required field 'seed'"):
        run.write_summary(broken)


def test_a_summary_written_before_versioning_reads_as_version_1(tmp_path: Path) -> None:
    old = summary_dict()
    # Fields added after the first release: ROC points, routers, traffic, wire, skipped rounds.
    for key in ("routers", "abstain_rate", "bytes_per_round_by_site", "wire", "skipped_rounds"):
        del old[key]
    for figures in old["sites"].values():
        del figures["roc"]
    old["n_pooled"] = 22  # a key a later medfed moved into the routers: ignored
    (tmp_path / "summary.json").write_text(json.dumps(old))

    summary = RunDir(tmp_path).read_summary()

    assert summary.routers == {} and summary.abstain_rate is None and summary.wire is None
    assert summary.sites["a"].roc is None and summary.skipped_rounds == []
    assert summary.federation.worst_site == "b"


def test_a_newer_summary_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary_dict(schema_version=SCHEMA_VERSION + 1)))

    with pytest.raises(RunDirError) as caught:
        RunDir(tmp_path).read_summary()

    message = str(caught.value)
    assert message.startswith(f"{path}: written with schema_version {SCHEMA_VERSION + 1}")
    assert "upgrade medfed" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.pop("worst_site_auc"), "missing required field 'worst_site_auc'"),
        (lambda d: d["sites"]["b"].pop("n_test"), "missing required field 'sites.b.n_test'"),
        (lambda d: d.update(rounds="three"), "field 'rounds' should be a whole number"),
        (
            lambda d: d["sites"]["a"].update(auc="high"),
            "'sites.a.auc' should be a number from 0 to 1, or null",
        ),
        (lambda d: d.update(schema_version="1"), "schema_version '1' is not a positive integer"),
    ],
    ids=["top", "site", "type", "site-type", "version"],
)
def test_a_damaged_summary_names_the_file_and_the_field(tmp_path, change, expected) -> None:
    data = summary_dict()
    change(data)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RunDirError) as caught:
        RunDir(tmp_path).read_summary()
    assert str(caught.value).startswith(f"{path}: ")
    assert expected in str(caught.value)
    assert "train the run again" in str(caught.value)


def test_missing_and_unparsable_summaries_say_so(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="summary.json: missing; the run has not finished"):
        RunDir(tmp_path).read_summary()
    (tmp_path / "summary.json").write_text("{")
    with pytest.raises(RunDirError, match="summary.json: not valid JSON"):
        RunDir(tmp_path).read_summary()
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match="summary.json: expected a JSON object, got list"):
        RunDir(tmp_path).read_summary()


def test_summary_is_built_from_its_evaluation_and_costs() -> None:
    summary = make_summary()
    evaluation = summary.evaluation
    costs = RunCosts.of([], ["a", "b"])

    rebuilt = Summary.build(
        evaluation,
        costs,
        **{
            k: getattr(summary, k)
            for k in ("algorithm", "params", "rounds", "local_steps", "seed", "backbone")
        },
        modality=summary.modality,
        device=summary.device,
        priors=summary.priors,
        resumes=0,
        wire=summary.wire,
    )

    assert isinstance(evaluation, Evaluation) and rebuilt.evaluation == evaluation
    assert rebuilt.bytes_per_round == 0.0 and rebuilt.dropouts == 0
    assert Evaluation.from_dict(evaluation.to_dict()) == evaluation


def test_summaries_read_like_their_json_for_older_code() -> None:
    summary = make_summary()

    assert summary["sites"]["a"]["auc"] == 0.8 and summary.get("engine") is None
    assert "routers" in summary and summary["dropped"][0]["site"] == "b"
    flower = summary | {"engine": "flower", "lost_sites": {}}
    assert flower.engine == "flower" and flower.to_dict()["lost_sites"] == {}
    assert Summary.from_dict(flower.to_dict()) == flower
    with pytest.raises(TypeError, match="no field"):
        summary | {"colour": "red"}
    assert dict(summary.items()) == summary.to_dict() and len(summary) == len(summary_dict())


# ---------------------------------------------------------------------------- metrics.jsonl
def test_round_records_keep_algorithm_figures_flat_and_typed() -> None:
    flat = {
        "round": 4,
        "site": "a",
        "status": "ok",
        "lr": 0.002,
        "train_loss": 0.41,
        "train_mixture_0": 0.25,
        "train_mixture_1": 0.75,
        "train_expert_loss": 0.3,
        "bytes_up": 1000,
        "bytes_down": 1200,
        "keys_sent": 12,
        "seconds": 0.1,
        "round_seconds": 0.3,
        "aggregated": True,
        "val_loss": 0.5,
        "val_auc": None,
        "val_accuracy": 0.75,
        "val_client_accuracy": 0.9,
    }

    record = RoundRecord.from_dict(flat)

    assert record.to_dict() == flat
    assert record.extra == {"train_mixture_0": 0.25, "train_mixture_1": 0.75} | {
        "train_expert_loss": 0.3
    }
    assert record.validation == Validation(loss=0.5, accuracy=0.75, client_accuracy=0.9)
    assert record.extras("train_mixture_") == {"0": 0.25, "1": 0.75}
    assert record.bytes_exchanged == 2200
    assert record["train_mixture_1"] == 0.75 and "val_auc" in record  # the older way


def test_round_records_refuse_text_where_a_figure_belongs() -> None:
    with pytest.raises(RunDirError, match="field 'note' should be a number"):
        RoundRecord.from_dict({"round": 1, "site": "a", "status": "ok", "note": "hi"})
    with pytest.raises(RunDirError, match="missing required field 'val_loss'"):
        RoundRecord.from_dict({"round": 1, "site": "a", "status": "ok", "val_auc": 0.5})
    with pytest.raises(ValueError, match="repeats the record's own fields"):
        RoundRecord(round=1, site="a", status="ok", extra={"train_loss": 1.0})


def test_metrics_jsonl_versions_every_line_and_reads_typed_records(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    typed = RoundRecord(round=1, site="a", status="ok", train_loss=0.5, extra={"train_x": 1.0})
    run.append_metrics([typed, {"round": 1, "site": "b", "status": "not_sampled", "lr": 0.1}])
    run.append_metrics([{"round": 2, "site": "a", "status": "dropped", "reason": "timeout"}])

    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    records = run.read_metrics()

    assert [line["schema_version"] for line in lines] == [SCHEMA_VERSION] * 3
    assert records[0] == typed and records[1].lr == 0.1 and records[2].reason == "timeout"
    run.truncate_metrics(1)
    assert [(r.round, r.site) for r in run.read_metrics()] == [(1, "a"), (1, "b")]
    with pytest.raises(RunDirError, match="metrics.jsonl \\(record to write\\).*'round'"):
        run.append_metrics([{"site": "a", "status": "ok"}])


def test_metrics_written_before_versioning_read_and_a_newer_line_is_refused(tmp_path) -> None:
    old = {"round": 1, "site": "a", "status": "ok", "train_loss": 0.5, "bytes_up": 10}
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(old) + "\n" + '{"round": 2, "si')  # cut short by a kill
    assert RunDir(tmp_path).read_metrics() == [RoundRecord.from_dict(old)]

    newer = old | {"schema_version": SCHEMA_VERSION + 1}
    path.write_text(json.dumps(old) + "\n" + json.dumps(newer) + "\n")
    with pytest.raises(RunDirError, match=f"metrics.jsonl:2: written with schema_version {2}"):
        RunDir(tmp_path).read_metrics()
    path.write_text(json.dumps({"site": "a", "status": "ok"}) + "\n")
    with pytest.raises(RunDirError, match="metrics.jsonl:1: missing required field 'round'"):
        RunDir(tmp_path).read_metrics()


def test_run_costs_come_from_the_round_records() -> None:
    def rec(round_: int, site: str, status: str = "ok", **fields: Any) -> RoundRecord:
        return RoundRecord(round=round_, site=site, status=status, **fields)

    records = [
        rec(1, "a", bytes_up=100, bytes_down=300, round_seconds=2.0, aggregated=True),
        rec(1, "b", bytes_up=100, bytes_down=300, round_seconds=2.0, aggregated=True),
        rec(2, "a", bytes_up=100, bytes_down=300, round_seconds=4.0, aggregated=False),
        rec(2, "b", "dropped", reason="crashed", round_seconds=4.0, aggregated=False),
    ]

    costs = RunCosts.of(records, ["a", "b"])

    assert costs.bytes_per_round == (800 + 400) / 2
    assert costs.bytes_per_round_by_site == {
        "a": SiteTraffic(up=100.0, down=300.0),
        "b": SiteTraffic(up=50.0, down=150.0),
    }
    assert costs.seconds_per_round == 3.0 and costs.seconds_total == 6.0
    assert costs.dropped == [Dropout(2, "b", "crashed")] and costs.dropouts == 1
    assert costs.skipped_rounds == [2]
    assert math.isclose(RunCosts.of([], ["a"]).bytes_per_round, 0.0)


# ---------------------------------------------------------------------------- the other files
def test_events_config_and_model_json_carry_the_schema_version(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.log_event("dropout", round=2, site="b", reason="timeout")
    run.write_config({"medfed_version": "0.1.0", "train": {"rounds": 3}})
    run.write_model_json({"algorithm": "feddrm", "sites": [{"id": "a"}]})

    raw_event = json.loads(run.events_path.read_text())
    assert raw_event["schema_version"] == SCHEMA_VERSION
    (event,) = run.read_events()
    assert event["event"] == "dropout" and "schema_version" not in event
    assert tomllib.loads(run.config_path.read_text())["schema_version"] == SCHEMA_VERSION
    assert run.read_config() == {"medfed_version": "0.1.0", "train": {"rounds": 3}}
    assert json.loads(run.model_json_path.read_text())["schema_version"] == SCHEMA_VERSION
    assert run.read_model_json() == {"algorithm": "feddrm", "sites": [{"id": "a"}]}


def test_newer_config_events_and_json_files_are_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    newer = SCHEMA_VERSION + 1
    run.config_path.write_text(f"schema_version = {newer}\n[train]\nrounds = 3\n")
    with pytest.raises(RunDirError, match="config.toml: written with schema_version"):
        run.read_config()
    run.events_path.write_text(json.dumps({"event": "start", "schema_version": newer}) + "\n")
    with pytest.raises(RunDirError, match="events.jsonl:1: written with schema_version"):
        run.read_events()
    state = tmp_path / "checkpoints" / "round_0001" / "state.json"
    write_json(state, {"round": 1})
    assert read_json(state) == {"round": 1}
    state.write_text(json.dumps({"round": 1, "schema_version": newer}))
    with pytest.raises(RunDirError, match="state.json: written with schema_version"):
        read_json(state)


def test_the_schema_and_the_run_directory_load_without_torch() -> None:
    script = (
        "import sys\n"
        "import medfed.runs.schema, medfed.runs.rundir, medfed.runs, medfed.reports.evaluation\n"
        "heavy = sorted(m for m in ('torch', 'safetensors', 'monai') if m in sys.modules)\n"
        "print(' '.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_summaries_compare_by_value() -> None:
    summary = make_summary()
    assert replace(summary, seed=1) != summary
    assert replace(summary, seed=0) == summary


def test_run_files_are_readable_by_the_group_as_a_plain_write_would_leave_them(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        RunDir(tmp_path).write_summary(make_summary())
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644


def test_every_figure_of_a_run_record_declares_its_kind() -> None:
    records = [
        cls
        for cls in vars(schema).values()
        if isinstance(cls, type) and issubclass(cls, Record) and cls is not Record
    ]
    undeclared = []
    for cls in [*records, FederationMetrics]:
        for slot in slots(cls):
            inner = get_args(slot.tp)[-1] if get_args(slot.tp) else slot.tp
            inner = get_args(inner)[0] if get_args(inner) else inner  # list[float | None]
            if inner in (int, float) and slot.kind is None:
                undeclared.append(f"{cls.__name__}.{slot.name}")
    assert not undeclared, f"numbers without a kind (medfed.core.kinds): {undeclared}"


def test_the_federation_figures_are_checked_against_their_kinds() -> None:
    for key, value, expected in [
        ("worst_site_auc", 1.5, "'worst_site_auc' should be a number from 0 to 1, or null"),
        ("n_sites", -2, "'n_sites' should be a whole number, 0 or more"),
        ("accuracy_std", float("nan"), "'accuracy_std' should be a finite number, 0 or more"),
        ("sites_without_auc", [3], "'sites_without_auc' should be a list of site ids"),
    ]:
        with pytest.raises(RunDirError, match=expected):
            Summary.from_dict(summary_dict(**{key: value}))
    summary = make_summary()
    assert summary.federation == FederationMetrics.from_dict(summary.to_dict())
