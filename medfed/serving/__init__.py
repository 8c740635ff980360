"""Serving a trained federation: the bundle, abstention, routers, file routing and its audit log."""
