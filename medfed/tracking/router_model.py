"""The model file MLflow runs to build a tracked run's router (see medfed.tracking.pyfunc)."""

import mlflow

from medfed.tracking.pyfunc import RoutingModel

mlflow.models.set_model(RoutingModel())
