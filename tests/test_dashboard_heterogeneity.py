"""The Sites page's heterogeneity section (Streamlit's AppTest on the shared trained run): the
same report as ``medfed sites heterogeneity --run RUN``."""

from __future__ import annotations

import json
import os

import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from medfed.cli import app
from medfed.dashboard import APP, RUNS_ENV
from medfed.reports.heterogeneity import ranking_text
from tests.badinput import Shared, shared  # noqa: F401 - the session fixture

TIMEOUT = 120  # seconds per script run: the first one imports torch and plotly


def test_sites_page_shows_the_heterogeneity_report(monkeypatch, shared: Shared) -> None:  # noqa: F811
    expected = CliRunner().invoke(
        app, ["sites", "heterogeneity", "--run", str(shared.run), "--json"]
    )
    assert expected.exit_code == 0, expected.output
    report = json.loads(expected.output)
    monkeypatch.setenv(RUNS_ENV, os.pathsep.join([str(shared.run)]))
    streamlit_config.set_option("server.address", "127.0.0.1")

    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    at.switch_page("views/sites.py").run()

    assert not at.exception, [e.value for e in at.exception]
    assert "Heterogeneity" in [s.value for s in at.subheader]
    shares = next(t.value for t in at.table if "share" in t.value.columns)
    for (site, name), row in shares.iterrows():
        p = report["prevalence"][site][name]
        assert row["share"] == pytest.approx(p["value"], abs=1e-3)
        assert row["scans"] == f"{p['k']}/{p['n']}"
    markdown = "\n".join(str(m.value) for m in at.markdown)
    assert f"label shift: **{report['label_shift']['level']}**" in markdown
    # the shipped sweeps' ranking for the regime found (or why there is none), as the CLI says it
    assert f"**Methods:** {ranking_text(report['methods'])}" in markdown
    assert "Guidance from medfed's synthetic scenarios" in "\n".join(c.value for c in at.caption)
