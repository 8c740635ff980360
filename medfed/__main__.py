"""``python -m medfed``: the command line, for machines where the package is not installed
(run from the source tree)."""

from medfed.cli import app

app(prog_name="medfed")
