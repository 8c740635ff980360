"""Running a federation: the in-process engine, the wire format, the run directory."""
