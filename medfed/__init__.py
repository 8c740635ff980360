"""medfed: federated learning across hospitals."""

__version__ = "0.1.0"
