"""The dashboard's entry point: ``medfed dashboard RUN...`` runs it with Streamlit.

Also ``streamlit run medfed/dashboard/app.py --server.address 127.0.0.1 -- RUN...``. RUN is a
run directory or a folder holding run directories (such as ``demo_out``). The pages show
patient-level results, so the app shows nothing when the server listens beyond this machine.
"""

from pathlib import Path

import streamlit as st

from medfed.dashboard import common, sitelog

VIEWS = Path(__file__).with_name("views")

st.set_page_config(page_title="medfed dashboard", layout="wide")
if (refusal := common.exposed()) is not None:
    st.error(refusal)
    st.stop()
audit = sitelog.state_dir() is not None  # medfed dashboard --state-dir: a site's audit log
runs = common.all_runs()
page = st.navigation(
    [
        st.Page(VIEWS / "federation.py", title="Federation", default=bool(runs) or not audit),
        st.Page(VIEWS / "training.py", title="Training"),
        st.Page(VIEWS / "sites.py", title="Sites"),
        st.Page(VIEWS / "routing.py", title="Routing"),
        st.Page(VIEWS / "review.py", title="Review"),
        st.Page(VIEWS / "communication.py", title="Communication"),
    ]
    + ([st.Page(VIEWS / "audit.py", title="Site audit", default=not runs)] if audit else [])
)
common.sidebar(runs)
page.run()
