"""The clinician dashboard from a source checkout: ``streamlit run dashboard/app.py -- RUN...``.

A thin entry over the packaged app (``medfed/dashboard/app.py``, what ``medfed dashboard``
starts): RUN (after ``--``) are run directories or folders holding them, as ``medfed dashboard``
takes them; ``MEDFED_DASHBOARD_RUNS`` (paths joined with ``os.pathsep``) overrides them, as it
does for the packaged app. ``.streamlit/config.toml`` beside this file keeps the server on
127.0.0.1; the pages refuse to show anything when it listens anywhere else. See README.md here.
"""

import importlib.util
import os
import runpy
import sys
from pathlib import Path

# Run from a checkout without `pip install -e .`, medfed is the folder above this one.
if importlib.util.find_spec("medfed") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from medfed.dashboard import APP, RUNS_ENV  # noqa: E402

# The packaged app reads its `-- RUN...` only when it is the script Streamlit ran; here the
# arguments reach it the way `medfed dashboard` passes them, as absolute paths.
if not os.environ.get(RUNS_ENV) and sys.argv[1:]:
    os.environ[RUNS_ENV] = os.pathsep.join(str(Path(p).resolve()) for p in sys.argv[1:])

runpy.run_path(str(APP), run_name="__main__")
