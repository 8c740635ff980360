"""Experiments over the library: the demo, the bench, speed figures and README table writers."""
