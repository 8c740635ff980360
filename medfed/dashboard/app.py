"""The dashboard's entry point: ``medfed dashboard RUN...`` runs it with Streamlit.

Also ``streamlit run medfed/dashboard/app.py --server.address 127.0.0.1 -- RUN...``. RUN is a
run directory or a folder holding run directories (such as ``demo_out``). The pages show
patient-level results, so the app shows nothing when the server listens beyond this machine.
"""

from pathlib import Path

import streamlit as st

from medfed.dashboard import PAGES, common, service, sitelog

VIEWS = Path(__file__).with_name("views")


def _page(title: str, default: bool = False) -> st.Page:
    return st.Page(VIEWS / PAGES[title], title=title, default=default)


st.set_page_config(page_title="medfed dashboard", layout="wide")
if (refusal := common.exposed()) is not None:
    st.error(refusal)
    st.stop()
audit = sitelog.state_dir() is not None  # medfed dashboard --state-dir: a site's audit log
runs = common.all_runs()
pages = [_page(title) for title in PAGES if title not in ("Federation", "Site audit")]
page = st.navigation(
    [_page("Federation", default=bool(runs) or not audit), *pages]
    + ([_page("Site audit", default=not runs)] if audit else [])
)
common.sidebar(runs)
with service.page_run(page.title):
    page.run()
