"""``medfed demo --modality ct``: the CT federation trains with the CT defaults and its table
goes to its own README section."""

from __future__ import annotations

import tomllib
from pathlib import Path

from medfed.data.modality import modality_spec
from medfed.experiments.demo import Budget, run_demo


def test_ct_demo_trains_the_ct_sites_with_the_ct_defaults(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- demo-table:start -->\nfundus\n<!-- demo-table:end -->\n"
        "<!-- demo-ct-table:start -->\nstale CT table\n<!-- demo-ct-table:end -->\n"
    )
    lines: list[str] = []
    summaries = run_demo(
        tmp_path / "demo",
        methods=("feddrm", "fedavg"),
        budget=Budget(n_per_site=10, rounds=1, local_steps=1),
        n_boot=20,
        echo=lines.append,
        readme=readme,
        marker="demo-ct-table",
        modality="ct",
    )

    assert sorted(summaries["fedavg"].sites) == ["ct_dicom", "ct_nifti"]
    ct = modality_spec("ct")
    for method in ("fedavg", "feddrm"):
        config = tomllib.loads((tmp_path / "demo" / "runs" / method / "config.toml").read_text())
        assert config["train"]["lr"] == ct.lr != modality_spec("fundus").lr
        assert config["model"]["backbone"] in (
            ct.default_backbone(False),
            ct.default_backbone(True),
        )
        assert config["model"]["backbone"].startswith("slices-")
    text = readme.read_text()
    assert "fundus" in text and "stale CT table" not in text  # only the CT section was replaced
    assert "`medfed demo --modality ct` (seed 0, 10 patients per site" in text
    assert any("2 CT sites (patients: 10 each)" in line for line in lines)
