"""Deterministic, seeded, patient-level train/val/test splits (no patient in two splits)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from medfed.config import SplitOptions
from medfed.core.errors import DataError
from medfed.data.records import Record, Split


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


def _groups(records: list[Record], contents: Sequence[str] | None) -> list[str]:
    """Each record's group: its patient, merged with every patient that shares a scan's bytes.

    A group is named by its smallest patient id; without ``contents`` it is the patient id.
    """
    parent: dict[str, str] = {r.patient_id: r.patient_id for r in records}

    def root(pid: str) -> str:
        while parent[pid] != pid:
            parent[pid] = parent[parent[pid]]
            pid = parent[pid]
        return pid

    first_of: dict[str, str] = {}
    for record, content in zip(records, contents or (), strict=False):
        other = first_of.setdefault(content, record.patient_id)
        a, b = root(other), root(record.patient_id)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [root(r.patient_id) for r in records]


def assign_splits(
    records: list[Record], options: SplitOptions, *, contents: Sequence[str] | None = None
) -> list[Split]:
    """One split per record; every record of a patient lands in the same split.

    ``contents`` (one content hash per record) keeps byte-identical scans together too: a copy
    of a test image under another name must not be trained on.
    """
    if contents is not None and len(contents) != len(records):
        raise ValueError("assign_splits needs one content hash per record")
    group_of = _groups(records, contents)
    by_patient: dict[str, list[Record]] = defaultdict(list)
    for record, group in zip(records, group_of, strict=True):
        by_patient[group].append(record)
    label_of = {pid: _patient_label(recs) for pid, recs in by_patient.items()}

    fixed: dict[str, Split] = {}
    if options.use_layout_split:
        for pid, recs in by_patient.items():
            declared = {r.split for r in recs if r.split is not None}
            if len(declared) > 1:
                raise DataError(_mixed_split_message(pid, recs, declared))
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
    return [patient_split[group] for group in group_of]


def _mixed_split_message(group: str, records: list[Record], declared: set[Split]) -> str:
    fix = (
        "(set split.use_layout_split = false to let medfed split by patient and content, "
        "or remove the copies)"
    )
    patients = sorted({r.patient_id for r in records})
    splits = sorted(map(str, declared))
    if len(patients) == 1:
        return (
            f"patient {group!r} appears in the layout's {splits} splits; a patient must stay in "
            f"one split {fix}"
        )
    files = ", ".join(f"{r.path} ({r.split or 'no split'})" for r in records[:6])
    return (
        f"byte-identical scans of patients {patients} lie in the layout's {splits} splits: "
        f"{files}; a scan and its copy must stay in one split {fix}"
    )
