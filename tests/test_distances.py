"""Site distances (MMD on appearance features) and the site overview that publishes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from medfed.core.errors import RunDirError
from medfed.data.distances import (
    SiteFeatures,
    distance_matrix,
    mmd_rbf,
    scan_features,
    site_distances,
)
from medfed.data.overview import OVERVIEW_FILE, read_site_overview, write_site_overview
from tests.tensorsites import tensor_sites


def _cloud(shift: float, n: int = 30, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(shift, 1.0, size=(n, 4))


def test_mmd_is_zero_for_the_same_scans_and_grows_with_the_shift() -> None:
    a = _cloud(0.0)
    assert mmd_rbf(a, a) == pytest.approx(0.0, abs=1e-12)
    assert 0 < mmd_rbf(a, _cloud(0.5, seed=1)) < mmd_rbf(a, _cloud(3.0, seed=1))


def test_scan_features_have_one_length_per_modality() -> None:
    photo, volume = torch.rand(3, 16, 16), torch.rand(1, 8, 16, 16)
    assert scan_features(photo).shape == (3 * 2 + 3 * 16,)
    assert scan_features(volume).shape == (1 * 2 + 1 * 8,)


def test_distances_compare_sites_of_one_modality_with_enough_scans() -> None:
    sites = [
        SiteFeatures("a", "fundus", _cloud(0.0)),
        SiteFeatures("b", "fundus", _cloud(2.0, seed=1)),
        SiteFeatures("c", "ct", _cloud(0.0, seed=2)[:, :2]),  # other features: not comparable
        SiteFeatures("d", "fundus", _cloud(0.0, n=1)),  # one scan: no distribution
        SiteFeatures("e", "fundus", None),  # nothing readable
    ]
    distances = site_distances(sites)
    assert distances[0] == {"b": distances[1]["a"]} and distances[0]["b"] > 0
    assert distances[2:] == [{}, {}, {}]


def test_a_pairs_distance_does_not_depend_on_the_other_sites_passed() -> None:
    a, b = (
        SiteFeatures("a", "fundus", _cloud(0.0)),
        SiteFeatures("b", "fundus", _cloud(1.0, seed=1)),
    )
    c = SiteFeatures("c", "fundus", _cloud(20.0, n=300, seed=2))
    alone = site_distances([a, b])
    together = site_distances([c, b, a])
    assert alone[0]["b"] == together[2]["b"] == together[1]["a"]
    assert list(together[0]) == ["b", "a"]  # the others in the order given


def test_a_pair_with_nan_features_is_unmeasured_not_zero_apart() -> None:
    broken = _cloud(0.0, seed=3)
    broken[0, 0] = np.nan
    assert np.isnan(mmd_rbf(broken, _cloud(2.0, seed=1)))
    sites = [
        SiteFeatures("a", "fundus", _cloud(0.0)),
        SiteFeatures("b", "fundus", broken),
        SiteFeatures("c", "fundus", _cloud(2.0, seed=1)),
    ]
    distances = site_distances(sites)
    assert "b" not in distances[0] and distances[1] == {} and distances[0]["c"] > 0
    # the report then has no matrix to read a covariate level from, rather than a false 0
    assert distance_matrix(["a", "b", "c"], distances) is None


def test_distance_matrix_needs_every_pair() -> None:
    table = distance_matrix(["a", "b"], [{"b": 0.5}, {"a": 0.5}])
    assert table is not None and table["matrix"] == [[0.0, 0.5], [0.5, 0.0]]
    assert distance_matrix(["a", "b"], [{"b": 0.5}, {}]) is None
    assert distance_matrix(["a"], [{}]) is None


def test_overview_is_written_into_a_plain_folder_and_read_back(tmp_path) -> None:
    sites = tensor_sites(2, n=16, size=8)
    out = write_site_overview(tmp_path, sites, samples_per_site=0, embed=False)
    overview = read_site_overview(tmp_path)
    assert out == tmp_path / "site_overview" and overview is not None
    assert sorted(overview["sites"]) == ["site0", "site1"]
    assert overview["distances"]["sites"] == ["site0", "site1"]
    assert (out / overview["sites"]["site0"]["card"]).read_text().startswith("# Data card: site0")
    assert not [p.name for p in out.rglob(".*")]  # no temporary file left behind


def test_reading_an_overview_names_the_damaged_file(tmp_path) -> None:
    assert read_site_overview(tmp_path) is None
    path = tmp_path / "site_overview" / OVERVIEW_FILE
    path.parent.mkdir()
    path.write_text(json.dumps({"format": 1}))
    with pytest.raises(RunDirError, match=OVERVIEW_FILE):
        read_site_overview(tmp_path)
