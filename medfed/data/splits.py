"""Deterministic, seeded, patient-level train/val/test splits (no patient in two splits)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from medfed.config import SplitOptions
from medfed.data.records import Record, Split
from medfed.errors import DataError


def _patient_label(records: list[Record]) -> int:
    # A patient's stratum is its most frequent label (ties -> the smallest index).
    counts = Counter(r.label for r in records)
    return min(counts, key=lambda label: (-counts[label], label))


def _carve(patients: list[str], label_of: dict[str, int], fraction: float, seed: int) -> set[str]:
    """Pick about ``fraction`` of the patients, stratified by label, reproducibly."""
    rng = np.random.default_rng(seed)
    chosen: set[str] = set()
    by_label: dict[int, list[str]] = defaultdict(list)
    for pid in sorted(patients):
        by_label[label_of[pid]].append(pid)
    for label in sorted(by_label):
        group = by_label[label]
        k = int(round(fraction * len(group)))
        if fraction > 0 and k == 0 and len(group) >= 3:
            k = 1  # a small class still gets represented in every split
        order = rng.permutation(len(group))
        chosen.update(group[i] for i in order[:k])
    return chosen


def assign_splits(records: list[Record], options: SplitOptions) -> list[Split]:
    """One split per record; every record of a patient lands in the same split."""
    by_patient: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_patient[record.patient_id].append(record)
    label_of = {pid: _patient_label(recs) for pid, recs in by_patient.items()}

    fixed: dict[str, Split] = {}
    if options.use_layout_split:
        for pid, recs in by_patient.items():
            declared = {r.split for r in recs if r.split is not None}
            if len(declared) > 1:
                raise DataError(
                    f"patient {pid!r} appears in the layout's {sorted(map(str, declared))} splits; "
                    "a patient must stay in one split (set split.use_layout_split = false "
                    "to let medfed split by patient)"
                )
            if declared:
                fixed[pid] = declared.pop()

    # Patients without a layout split, plus the layout's training patients, form the pool that
    # test and validation are carved from when the layout itself provides none.
    pool = sorted(pid for pid in by_patient if fixed.get(pid, Split.TRAIN) is Split.TRAIN)
    patient_split = dict(fixed)
    n_all = max(1, len(by_patient))
    for split, fraction, offset in (
        (Split.TEST, options.test_fraction, 0),
        (Split.VAL, options.val_fraction, 1),
    ):
        if split in fixed.values() or not pool:
            continue
        share = min(0.9, fraction * n_all / len(pool))
        carved = _carve(pool, label_of, share, options.seed + offset)
        patient_split.update({pid: split for pid in carved})
        pool = [pid for pid in pool if pid not in carved]
    patient_split.update({pid: Split.TRAIN for pid in pool})
    return [patient_split[r.patient_id] for r in records]
