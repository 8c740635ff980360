"""The trained federation as an MLflow model: photo in, routed site, class probabilities and
abstention out, exactly as ``medfed route --json --no-audit`` answers.

It is logged "from code" (``router_model.py`` is the model's file; nothing is unpickled when it
is loaded), with the run's model folder, config.toml and summary.json as its artifact.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
    """Routes each photo with the run's default router; one row per photo, the fields of
    ``medfed route --json``. The photos: a path, a list of paths, or a DataFrame with a
    ``path`` column and/or an ``image`` column of the file's bytes (an optional ``name``
    column names a bytes row in the answer, as an upload's name does)."""

    def load_context(self, context) -> None:
        from medfed.routing.bundle import TrainedFederation
        from medfed.routing.routers import make_router

        self.fed = TrainedFederation.load(context.artifacts["run"], "cpu")
        self.router = make_router("auto", self.fed)

    def predict(self, context, model_input, params=None):  # no hints: MLflow reads them
        import pandas as pd

        from medfed.clinic.route import route_files

        with _photo_files(model_input) as (paths, names):
            results = route_files(self.fed, self.router, paths, None, names)
        return pd.DataFrame([r.to_dict() for r in results])


# how a photo's bytes begin -> the suffix that tells medfed how to read it
MAGIC = ((b"\xff\xd8", ".jpg"), (b"\x89PNG", ".png"), (b"II*\x00", ".tif"), (b"MM\x00*", ".tif"))


@contextmanager
def _photo_files(model_input: Any) -> Iterator[tuple[list[Path], list[str | None]]]:
    """The photos as files (bytes written to a temporary folder, removed afterwards) and the
    names the answers give them (None: the path itself)."""
    import pandas as pd

    if isinstance(model_input, str | Path):
        model_input = [model_input]
    if not isinstance(model_input, pd.DataFrame):
        model_input = pd.DataFrame({"path": [str(v) for v in model_input]})
    if not {"path", "image"} & set(model_input.columns):
        raise ValueError("give the photos as a DataFrame with a 'path' or an 'image' column")
    with tempfile.TemporaryDirectory(prefix="medfed-pyfunc-") as tmp:
        paths: list[Path] = []
        names: list[str | None] = []
        for i, row in enumerate(model_input.to_dict("records")):
            image, path = row.get("image"), row.get("path")
            if isinstance(image, bytes | bytearray | memoryview):
                name = row.get("name") if isinstance(row.get("name"), str) else f"photo{i}"
                paths.append(_written(Path(tmp) / str(i), bytes(image), name))
                names.append(name)
            elif isinstance(path, str | Path):
                paths.append(Path(str(path)))
                names.append(None)
            else:
                raise ValueError(f"row {i}: neither a photo's path nor its bytes")
        yield paths, names


def _written(folder: Path, data: bytes, name: str) -> Path:
    """``data`` saved under ``folder`` with a suffix medfed reads (the name's, else sniffed)."""
    folder.mkdir()
    suffix = Path(name).suffix or next((s for m, s in MAGIC if data.startswith(m)), "")
    if data[128:132] == b"DICM":
        suffix = suffix or ".dcm"
    target = folder / f"photo{suffix}"
    target.write_bytes(data)
    return target


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
