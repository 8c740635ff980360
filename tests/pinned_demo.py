"""What of a quick demo must not change: its table, every run's summary.json, metrics.jsonl,
model files and per-scan predictions, less the figures that measure time.

The test runs the demo as the test suite does (one thread per site, CI's setting). A change
that is meant to move the demo's figures re-pins them there, and the commit says why:

    MEDFED_REPIN=1 python -m pytest tests/test_demo_pinned.py

Floating-point results depend on the vector instructions PyTorch picks for the CPU (AVX2 and
AVX-512 kernels sum in different orders), so the pin records the CPU capability it was taken
on. On a CPU of that capability every figure and file must be equal; on another, the demo must
keep the pin's shape (every table row and column, every summary field, every round, every model
file, each number still a finite number where the pin has one), and its figures are not compared:
nor the verdicts read off them, nor the number of points of a curve (ROC points follow the
scores).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "quick_demo.json"
# Wall-clock figures differ from run to run; everything else is a function of seed and threads.
TIMED = re.compile(r"seconds|latency|^time$")
TIMED_TEXT = re.compile(r"\b\d+ s in all\b")  # the table's note of the demo's wall time


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not TIMED.search(k)}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(run: Path, out: Path) -> dict[str, Any]:
    files = json.loads((run / "model" / "files.json").read_text(encoding="utf-8"))["files"]
    metrics = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return {
        "summary": _untimed(json.loads((run / "summary.json").read_text(encoding="utf-8"))),
        "metrics": [_untimed(json.loads(line)) for line in metrics if line.strip()],
        "model": {name: entry["sha256"] for name, entry in sorted(files.items())},
        "predictions.csv": _sha256(run / "predictions.csv"),
        # the sites' folders, under the demo's folder, as "{OUT}/..."
        "config.toml": (run / "config.toml")
        .read_text(encoding="utf-8")
        .replace(str(out.resolve()), "{OUT}"),
    }


def snapshot(out: Path) -> dict[str, Any]:
    """The pinned content of the demo folder ``out``."""
    runs = sorted(p for p in (out / "runs").iterdir() if (p / "summary.json").is_file())
    return {
        "table": TIMED_TEXT.sub("N s in all", (out / "demo-table.md").read_text(encoding="utf-8")),
        "runs": {run.name: _run(run, out) for run in runs},
    }


def machine() -> str:
    """The CPU capability PyTorch's kernels were chosen for (``AVX2``, ``AVX512``, ...)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


# Lists whose length follows the figures rather than the run's shape: the routing
# calibration's bins (only the bins some scan fell in are listed, and which those are moves
# with the last digits).
FOLLOW_THE_FIGURES = (".routing_calibration.bins", ".routing_calibration_uncalibrated.bins")


def shape_differences(found: Any, pinned: Any, where: str = "") -> list[str]:
    """Where ``found`` lacks the shape of ``pinned``: keys, list lengths, kinds of values, the
    table's header and row labels; numbers and hashes may differ."""
    if isinstance(found, dict) and isinstance(pinned, dict):
        out = [f"{where}.{k}: missing" for k in pinned.keys() - found.keys()]
        out += [f"{where}.{k}: not pinned" for k in found.keys() - pinned.keys()]
        for key in found.keys() & pinned.keys():
            out += shape_differences(found[key], pinned[key], f"{where}.{key}")
        return out
    if isinstance(found, list) and isinstance(pinned, list):
        if all(_scalar(v) for v in [*found, *pinned]):  # a curve: its points follow the scores
            bad = [v for v in found if v is not None and not _finite(v)]
            return [f"{where}: {bad[:3]} are not numbers"] if bad else []
        if where.endswith(FOLLOW_THE_FIGURES) and found and pinned:
            # as many items as the figures fill (calibration bins list the non-empty ones):
            # each has the shape of a pinned one
            return [
                d
                for i, a in enumerate(found)
                for d in shape_differences(a, pinned[0], f"{where}[{i}]")
            ]
        if len(found) != len(pinned):
            return [f"{where}: {len(found)} items != pinned {len(pinned)}"]
        pairs = enumerate(zip(found, pinned, strict=True))
        return [d for i, (a, b) in pairs for d in shape_differences(a, b, f"{where}[{i}]")]
    if isinstance(found, str) and isinstance(pinned, str):
        if where == ".table":
            return differences(_table_shape(found), _table_shape(pinned), where)
        if where.endswith("config.toml"):
            return differences(_labels(found), _labels(pinned), where)
        return []  # a hash, a site or method name written from the figures
    if _scalar(pinned) and pinned is not None:
        return [] if _finite(found) else [f"{where}: {found!r} is not a number"]
    return [] if type(found) is type(pinned) else [f"{where}: {found!r} != pinned {pinned!r}"]


def _scalar(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _finite(value: Any) -> bool:
    return _scalar(value) and value is not None and value == value and abs(value) != float("inf")


def _labels(text: str) -> str:
    """A table's or config's words without its numbers: its header and row labels."""
    words = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", text)
    return re.sub(r"[ \t]+", " ", re.sub(r"-{3,}", "---", words))  # widths follow the numbers


def _table_shape(text: str) -> str:
    """The demo table's shape: every header whole, each row's label and number of cells, and
    of each other line what leads its verdicts ("- seed 0, worst-site AUC (origin known)")."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        separator = set(line) <= set("|- ")
        header = i + 1 < len(lines) and set(lines[i + 1]) <= set("|- ") and "|" in lines[i + 1]
        if line.startswith("|") and not (separator or header):
            out.append(f"| {cells[0]} | {len(cells)} cells")
        else:
            out.append(_labels(line.split(": ", 1)[0] if line.startswith("- ") else line))
    return "\n".join(out)


def differences(found: Any, pinned: Any, where: str = "") -> list[str]:
    """Where ``found`` and ``pinned`` differ, as readable paths (the first few)."""
    if isinstance(found, dict) and isinstance(pinned, dict):
        out = [f"{where}.{k}: missing" for k in pinned.keys() - found.keys()]
        out += [f"{where}.{k}: not pinned" for k in found.keys() - pinned.keys()]
        for key in found.keys() & pinned.keys():
            out += differences(found[key], pinned[key], f"{where}.{key}")
        return out
    if isinstance(found, list) and isinstance(pinned, list) and len(found) == len(pinned):
        pairs = enumerate(zip(found, pinned, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(found, str) and isinstance(pinned, str) and "\n" in found + pinned:
        lines = zip(found.splitlines(), pinned.splitlines(), strict=False)
        for n, (a, b) in enumerate(lines, 1):
            if a != b:
                return [f"{where} line {n}: {a!r} != pinned {b!r}"[:600]]
    return [] if found == pinned else [f"{where}: {found!r} != pinned {pinned!r}"[:400]]


def pin(found: dict[str, Any]) -> None:
    """Write ``found`` as the pinned figures, with the CPU capability they were taken on."""
    with FIXTURE.open("w", encoding="utf-8") as stream:
        json.dump({**found, "machine": machine()}, stream, indent=1, sort_keys=True)
        stream.write("\n")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    pin(snapshot(Path(argv[0])))
    print(f"pinned {argv[0]} in {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
