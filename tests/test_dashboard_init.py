"""The Training page's "Starting weights": seeded random weights, or the pretrained weights a
run's config.toml records in its [init] table (loaded, skipped with reasons, left random)."""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest

from medfed.core.errors import RunDirError
from medfed.dashboard import APP, RUNS_ENV
from medfed.dashboard.rundata import (
    RANDOM_INIT,
    StartingWeights,
    starting_weights,
    starting_weights_table,
)
from tests.dashboard_runs import DashboardRuns, dashboard_runs  # noqa: F401 - session fixture

TIMEOUT = 120
SHA = "9f2c4e1d0b7a" + "3" * 52
FC_REASON = "ImageNet classifier (1000 classes); medfed's heads start fresh"
INIT = {
    "source": "runs/warmup",
    "kind": "run",
    "file": "/abs/path/global.safetensors",
    "format": "medfed",
    "sha256": SHA,
    "strict": False,
    "normalization": "site",
    "weights_normalization": "imagenet",
    "loaded": ["backbone.stem.0.weight", "backbone.stem.0.bias", "backbone.layer1.weight"],
    "skipped": [
        {"key": "fc.weight", "reason": FC_REASON},
        {"key": "fc.bias", "reason": FC_REASON},
    ],
    "random": ["target_head.weight"],
    "adapters": 24,
}


@pytest.fixture(scope="module")
def runs(dashboard_runs: DashboardRuns) -> DashboardRuns:  # noqa: F811
    return dashboard_runs


def with_init(source: Path, tmp_path: Path, name: str, init: object | None) -> Path:
    """A copy of the run ``source`` named ``name`` whose config.toml holds ``init`` as [init]."""
    run = tmp_path / "runs" / name
    shutil.copytree(source, run)
    if init is not None:
        path = run / "config.toml"
        config = tomllib.loads(path.read_text(encoding="utf-8"))
        path.write_text(tomli_w.dumps(config | {"init": init}), encoding="utf-8")
    return run


def training_page(monkeypatch, roots: list[Path]) -> AppTest:
    monkeypatch.setenv(RUNS_ENV, os.pathsep.join(map(str, roots)))
    streamlit_config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    at.switch_page("views/training.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest, *kinds: str) -> str:
    return "\n".join(str(e.value) for kind in kinds for e in at.get(kind))


def frame_with(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


# ------------------------------------------------------------------------------ parsing
def test_init_table_is_read_into_what_the_page_shows(tmp_path: Path) -> None:
    where = tmp_path / "config.toml"
    assert starting_weights({"train": {"rounds": 3}}, where) is None
    assert starting_weights(None, where) is None

    weights = starting_weights({"train": {}, "init": INIT}, where)
    assert weights is not None
    assert weights.source == "runs/warmup" and (weights.kind, weights.format) == ("run", "medfed")
    assert weights.short_sha256 == "9f2c4e1d0b7a"
    assert (len(weights.loaded), len(weights.skipped), len(weights.random)) == (3, 2, 1)
    assert weights.skipped[0] == ("fc.weight", FC_REASON)
    assert weights.adapters == 24 and weights.strict is False
    note = weights.normalization_note()
    assert note is not None and "ImageNet" in note and "site" in note
    same = starting_weights({"init": INIT | {"normalization": "imagenet"}}, where)
    assert same is not None and same.normalization_note() is None
    unknown = starting_weights({"init": INIT | {"weights_normalization": ""}}, where)
    assert unknown is not None and unknown.normalization_note() is None

    table = starting_weights_table({"a": weights, "b": None, "c": RunDirError("x")})
    assert table.loc["a"].tolist() == ["runs/warmup", "3", "2", "1"]
    assert table.loc["b"].tolist() == [RANDOM_INIT, "0", "0", "all"]
    assert table.loc["c", "source"] == "damaged [init] in config.toml"


def test_optional_init_fields_may_be_missing(tmp_path: Path) -> None:
    least = {"source": "w.safetensors", "loaded": ["a"], "skipped": [], "random": []}
    weights = starting_weights({"init": least}, tmp_path / "config.toml")
    assert weights == StartingWeights(source="w.safetensors", loaded=("a",), skipped=(), random=())
    assert weights.adapters is None and weights.short_sha256 == ""


@pytest.mark.parametrize(
    ("init", "words"),
    [
        ("runs/warmup", "init = 'runs/warmup' is not a table"),
        (INIT | {"loaded": 5}, "loaded = 5 is not a list of model key names"),
        (INIT | {"random": ["a", 2]}, "random = ['a', 2] is not a list"),
        (INIT | {"skipped": [{"key": "fc.weight"}]}, "skipped = "),
        (INIT | {"skipped": ["fc.weight"]}, "is not a list of {key, reason} tables"),
        (INIT | {"source": 3}, "source = 3 is not a string"),
        (INIT | {"source": ""}, "has no source"),
        ({k: v for k, v in INIT.items() if k != "loaded"}, "has no 'loaded'"),
        (INIT | {"sha256": 12}, "sha256 = 12 is not a string"),
        (INIT | {"strict": "no"}, "strict = 'no' is not true or false"),
        (INIT | {"adapters": -1}, "adapters = -1 is not a count"),
        (INIT | {"adapters": True}, "adapters = True is not a count"),
    ],
)
def test_a_damaged_init_table_is_an_error_naming_config_toml(tmp_path, init, words) -> None:
    where = tmp_path / "run" / "config.toml"
    with pytest.raises(RunDirError) as caught:
        starting_weights({"train": {}, "init": init}, where)
    message = str(caught.value)
    assert message.startswith(f"{where}: ") and words in message


# ------------------------------------------------------------------------------ the page
def test_a_run_without_init_started_from_random_weights(monkeypatch, runs) -> None:
    at = training_page(monkeypatch, [runs.fedavg])
    assert "Starting weights" in texts(at, "subheader")
    assert "random (seeded) initialization" in texts(at, "markdown")
    assert not at.warning and not at.dataframe


def test_a_run_with_init_shows_source_counts_and_skipped_reasons(
    monkeypatch, runs, tmp_path
) -> None:
    run = with_init(runs.fedavg, tmp_path, "pretrained", INIT)
    at = training_page(monkeypatch, [run])
    shown = texts(at, "markdown")
    assert "runs/warmup" in shown and "kind run, format medfed, strict: no" in shown
    assert "9f2c4e1d0b7a" in shown and SHA not in shown
    assert "3 loaded, 2 skipped, 1 left random (seeded); 24 LoRA adapter tensors" in shown
    assert "random (seeded) initialization" not in shown
    skipped = frame_with(at, "reason")
    assert skipped["key"].tolist() == ["fc.weight", "fc.bias"]
    assert skipped["reason"].tolist() == [FC_REASON, FC_REASON]
    assert frame_with(at, "loaded key")["loaded key"].tolist() == INIT["loaded"]
    assert frame_with(at, "key left random")["key left random"].tolist() == INIT["random"]
    assert "came with ImageNet normalization" in texts(at, "info")
    assert at.get("plotly_chart") and "No site dropped out." in shown  # the page goes on below


def test_a_damaged_init_is_a_warning_naming_config_toml(monkeypatch, runs, tmp_path) -> None:
    run = with_init(runs.fedavg, tmp_path, "damaged", INIT | {"loaded": 5})
    at = training_page(monkeypatch, [run])
    warning = texts(at, "warning")
    assert "config.toml" in warning and "loaded = 5" in warning
    assert not at.error and not at.dataframe
    assert at.get("plotly_chart")  # the run's curves still show


def test_several_runs_get_one_row_each_and_their_details(monkeypatch, runs, tmp_path) -> None:
    pretrained = with_init(runs.fedavg, tmp_path, "pretrained", INIT)
    plain = with_init(runs.fedavg, tmp_path, "plain", None)
    at = training_page(monkeypatch, [pretrained, plain])
    table = frame_with(at, "source")
    assert table.loc["pretrained"].tolist() == ["runs/warmup", "3", "2", "1"]
    assert table.loc["plain"].tolist() == [RANDOM_INIT, "0", "0", "all"]
    labels = [e.label for e in at.expander]
    assert "pretrained: starting weights" in labels and "plain: starting weights" in labels
    assert frame_with(at, "reason")["reason"].tolist() == [FC_REASON, FC_REASON]
