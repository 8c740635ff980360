"""Experiment tracking with MLflow (the optional extra ``medfed[mlflow]``).

A run folder already holds everything a tracker wants: its resolved settings (config.toml),
its rounds (metrics.jsonl), its figures with their intervals (summary.json), its model card and
data cards. :func:`~medfed.tracking.runlog.log_run` reads the folder and logs it as one MLflow
run: the settings as parameters, tags, per-round metrics, the final figures (``_low`` /
``_high`` for their 95% intervals) and the files as artifacts, plus the trained federation as a
pyfunc model that routes (:mod:`medfed.tracking.pyfunc`). ``medfed train --track URI`` calls it
when the run ends, ``medfed track RUN`` later (the same code path: a run trained while the
tracking server was down is uploaded whole); a folder of runs (compare, bench, scenarios,
real-study) becomes a parent run with one child per run. Nothing per scan leaves the folder
(predictions.csv, the audit log and review scans are never logged).

MLflow is imported only here and only when tracking is asked for: medfed trains, routes and
serves without it.
"""

from medfed.tracking.settings import TRACKING_FILE, TrackSettings, tracking_settings

__all__ = ["TRACKING_FILE", "TrackSettings", "tracking_settings"]
