"""Figures of runs as text, markdown and HTML: the one place that formats a figure with its CI,
a rate with its counts, a table, a marked README or docs section and the study report, for the
CLI, the dashboard, the experiments and ``report.html``. Reads runs through
:mod:`medfed.runs`; writes nothing but the files its callers name.

* :mod:`~medfed.reports.text`: one figure (``fmt``, ``ci_text``, ``rate_text``, ``count_text``)
* :mod:`~medfed.reports.markdown`: tables, result files, marked sections
* :mod:`~medfed.reports.evaluation`: what ``medfed evaluate`` and ``compare`` print
* :mod:`~medfed.reports.prospective`: the prospective review's figures
* :mod:`~medfed.reports.comparisons`: paired differences between methods and their verdicts
* :mod:`~medfed.reports.study`: the study report (one self-contained HTML file)
"""

from medfed.reports.markdown import markdown_table
from medfed.reports.text import (
    NA,
    UNRELIABLE_MARK,
    bounds_text,
    ci_text,
    count_text,
    fmt,
    pooled_text,
    rate_text,
)

__all__ = [
    "NA",
    "UNRELIABLE_MARK",
    "bounds_text",
    "ci_text",
    "count_text",
    "fmt",
    "markdown_table",
    "pooled_text",
    "rate_text",
]
