"""The pinned quick demo's comparison on a CPU of another capability: figures may move (other
kernels sum in other orders), the demo's shape may not."""

from __future__ import annotations

import copy
import json

from tests.pinned_demo import FIXTURE, differences, shape_differences


def _pinned() -> dict:
    pinned = json.loads(FIXTURE.read_text(encoding="utf-8"))
    pinned.pop("machine")
    return pinned


def test_moved_figures_keep_the_shape_but_not_the_pin() -> None:
    pinned = _pinned()
    moved = copy.deepcopy(pinned)
    run = next(iter(moved["runs"].values()))
    site = next(iter(run["summary"]["sites"].values()))
    site["auc"] = 0.5 if site["auc"] != 0.5 else 0.6
    site["roc"]["fpr"] = site["roc"]["fpr"][:-1]  # a curve's points follow the scores
    first = run["metrics"][0]
    key = next(k for k, v in first.items() if isinstance(v, float))
    first[key] = 123.0
    run["model"] = {name: "0" * 64 for name in run["model"]}
    lines = moved["table"].splitlines()  # a verdict in a comparison row, and in its list
    row = next(
        i for i, line in enumerate(lines) if line.startswith("| fedbn") and "detected" in line
    )
    lines[row] = lines[row].replace("no difference detected", "ahead      ", 1)
    said = next(i for i, line in enumerate(lines) if line.startswith("- seed 0"))
    lines[said] = lines[said].replace("no difference detected against", "ahead of", 1)
    moved["table"] = "\n".join(lines)

    assert differences(moved, pinned)
    assert shape_differences(moved, pinned) == []


def test_a_lost_field_round_or_column_changes_the_shape() -> None:
    pinned = _pinned()
    name = next(iter(pinned["runs"]))
    for change in ("field", "round", "column", "nan"):
        moved = copy.deepcopy(pinned)
        run = moved["runs"][name]
        if change == "field":
            run["summary"].pop("worst_site")
        elif change == "round":
            run["metrics"].pop()
        elif change == "column":
            moved["table"] = moved["table"].replace("| method   |", "| methods  |", 1)
        else:
            next(iter(run["summary"]["sites"].values()))["auc"] = float("nan")
        assert shape_differences(moved, pinned), change


def test_calibration_bins_may_be_more_or_fewer_but_each_keeps_its_shape() -> None:
    pinned = _pinned()
    moved = copy.deepcopy(pinned)
    bins = moved["runs"]["feddrm"]["summary"]["routing_calibration"]["bins"]
    bins.append(copy.deepcopy(bins[0]))  # a scan fell in one more bin on this CPU

    assert shape_differences(moved, pinned) == []
    del bins[-1][next(iter(bins[-1]))]
    assert shape_differences(moved, pinned)  # a bin without one of its figures is a new shape
    site = next(iter(moved["runs"]["feddrm"]["summary"]["sites"].values()))
    del bins[-1]
    del site["calibration"]["bins"][-1]  # a site's ten bins are always ten
    assert shape_differences(moved, pinned) == [
        f".runs.feddrm.summary.sites.{next(iter(moved['runs']['feddrm']['summary']['sites']))}"
        ".calibration.bins: 9 items != pinned 10"
    ]
