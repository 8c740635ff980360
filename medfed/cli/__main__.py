"""``python -m medfed.cli``: the command line, as ``python -m medfed``."""

from medfed.cli import app

app(prog_name="medfed")
