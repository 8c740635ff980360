"""Diabetic retinopathy grading: the ICDR grades and the clinical endpoint built on them.

The International Clinical Diabetic Retinopathy (ICDR) scale grades an eye 0-4. Screening
programmes refer an eye to an ophthalmologist from grade 2 (moderate) on: "referable DR".
"""

from __future__ import annotations

from collections.abc import Mapping

ICDR_GRADES = ("no_dr", "mild", "moderate", "severe", "proliferative")
"""Class names of ICDR grades 0-4, as the DR layouts and the synthetic DR sites use them."""

REFERABLE_FROM = 2
"""The grade from which DR is referable (moderate non-proliferative DR or worse)."""

ICDR_LABELS: dict[str, int] = {name: grade for grade, name in enumerate(ICDR_GRADES)}
"""The [labels] table of an ICDR-graded site."""

DEFAULT_GRADE_NAMES: dict[str, str] = {str(g): name for g, name in enumerate(ICDR_GRADES)}
"""A grading table's values ("0".."4") -> class names, the DR layouts' default."""


def is_icdr_grading(class_names: Mapping[int, str]) -> bool:
    """Whether classes 0..4 are the ICDR grades (a task whose referable endpoint is defined)."""
    return dict(class_names) == dict(enumerate(ICDR_GRADES))
