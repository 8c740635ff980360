"""The trained federation as an MLflow model: photo in, routed site, class probabilities and
abstention out, exactly as ``medfed route --json --no-audit`` answers.

It is logged "from code" (``router_model.py`` is the model's file; nothing is unpickled when it
is loaded), with the run's model folder, config.toml and summary.json as its artifact.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow

from medfed import __version__

if TYPE_CHECKING:
    from medfed.tracking.runlog import Tracker

MODEL_NAME = "router"
MODEL_FILE = Path(__file__).with_name("router_model.py")
RUN_FILES = ("config.toml", "summary.json")


class RoutingModel(mlflow.pyfunc.PythonModel):
    """Routes each photo (a path, or a DataFrame with a ``path`` column) with the run's
    default router; one row per photo, the fields of ``medfed route --json``."""

    def load_context(self, context) -> None:
        from medfed.serving.bundle import TrainedFederation
        from medfed.serving.routers import make_router

        self.fed = TrainedFederation.load(context.artifacts["run"], "cpu")
        self.router = make_router("auto", self.fed)

    def predict(self, context, model_input, params=None):  # no hints: MLflow reads them
        import pandas as pd

        from medfed.serving.service import route_files

        paths = _paths(model_input)
        results = route_files(self.fed, self.router, paths, None)
        return pd.DataFrame([r.to_dict() for r in results])


def _paths(model_input: Any) -> list[Path]:
    import pandas as pd

    if isinstance(model_input, pd.DataFrame):
        if "path" not in model_input.columns:
            raise ValueError("give the photos as a DataFrame with a 'path' column")
        values = model_input["path"].tolist()
    elif isinstance(model_input, str | Path):
        values = [model_input]
    else:
        values = list(model_input)
    return [Path(str(v)) for v in values]


def log_router(tracker: Tracker, run_id: str, run: Path) -> None:
    """Log ``run``'s federation as the pyfunc model ``router`` of MLflow run ``run_id``, and
    register it under the settings' name when one is given."""
    if not (run / "model" / "model.json").is_file():
        return  # a run without a final model (a warm-up base's summary only) routes nothing
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracker.settings.uri)
    mlflow.set_registry_uri(tracker.settings.uri)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "run"
            shutil.copytree(run / "model", copy / "model")
            for name in RUN_FILES:
                shutil.copy2(run / name, copy / name)
            with mlflow.start_run(run_id=run_id):
                mlflow.pyfunc.log_model(
                    name=MODEL_NAME,
                    python_model=str(MODEL_FILE),
                    artifacts={"run": str(copy)},
                    pip_requirements=[f"medfed=={__version__}"],
                    registered_model_name=tracker.settings.register,
                )
    finally:
        mlflow.set_tracking_uri(previous)
