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
PAGES = {
    "Federation": "federation.py",
    "Training": "training.py",
    "Sites": "sites.py",
    "Routing": "routing.py",
    "Review": "review.py",
    "Communication": "communication.py",
    "Site audit": "audit.py",
}
"""Page title -> its script under ``views/``, in the order the navigation shows them."""
EVENTS_ENV = "MEDFED_DASHBOARD_EVENTS"
"""Set to 1 when ``medfed dashboard`` supervises Streamlit (``--log-format json`` or
``--metrics-port``): each page run then prints one line the supervisor logs and counts."""
