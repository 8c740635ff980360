"""The clinician dashboard: a Streamlit app over run directories (``medfed dashboard``).

It reads run directories only (``config.toml``, ``metrics.jsonl``, ``events.jsonl``,
``summary.json``, ``site_overview/``, ``model/``, ``audit.sqlite``); it never imports the
training code. Pages live in ``views/``; ``rundata`` and ``clinical`` turn run files into tables
and ``charts`` turns tables into figures, all without Streamlit, so they can be tested on their
own.
"""

from pathlib import Path

APP = Path(__file__).with_name("app.py")
RUNS_ENV = "MEDFED_DASHBOARD_RUNS"
"""Run directories (or folders holding them) to show, joined with os.pathsep."""
MAX_UPLOAD_MB = 200
"""The largest scan the Routing page accepts, in MB (Streamlit's server.maxUploadSize)."""
STATE_ENV = "MEDFED_DASHBOARD_STATE_DIR"
"""A SuperNode's state folder whose audit log the Site audit page shows (``--state-dir``)."""
