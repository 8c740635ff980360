"""Helpers shared by the layout readers: options, labels, patient ids, images, label tables."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from medfed.config import SiteManifest
from medfed.core.errors import DataError, ManifestError
from medfed.data.io import IMAGE_SUFFIXES, permission_denied, require_regular, special_kind
from medfed.data.records import LayoutScan, Problem, Record, Split

# Files operating systems drop into folders; never scans.
OS_CLUTTER = frozenset({"thumbs.db", "desktop.ini"})
# The message of a warning about a file that is not a scan (check_site groups them by it).
STRAY_FILE = "not an image file; ignored"
# An .xlsx file is a zip of XML parts: more than this many bytes unpacked is refused.
MAX_XLSX_UNPACKED = 200_000_000


def where(manifest: SiteManifest) -> str:
    """How errors name the manifest: its file when known, else the site id."""
    return str(manifest.manifest_path or f"site {manifest.id!r}")


def check_options(manifest: SiteManifest, known: Iterable[str]) -> dict[str, Any]:
    """Return the layout options, raising ManifestError on keys this layout does not know."""
    known = set(known)
    unknown = set(manifest.layout_options) - known
    if unknown:
        raise ManifestError(
            f"{where(manifest)}: unknown key(s) {sorted(unknown)} in [layout_options] for layout "
            f"{manifest.layout!r}; known keys: {sorted(known) or 'none'}"
        )
    return dict(manifest.layout_options)


def option_table(manifest: SiteManifest, key: str, default: Mapping[str, str]) -> dict[str, str]:
    """A string -> string table from [layout_options], or the default."""
    value = manifest.layout_options.get(key, default)
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ManifestError(
            f"{where(manifest)}: layout_options.{key} must be a table of strings, "
            f"e.g. {dict(default)!r}; got {value!r}"
        )
    return dict(value)


def require_classes(manifest: SiteManifest, names: Iterable[str], setting: str) -> None:
    """Raise ManifestError unless every class name is declared in [labels]."""
    missing = sorted(set(names) - set(manifest.labels))
    if missing:
        raise ManifestError(
            f"{where(manifest)}: {setting} uses class name(s) {missing} that [labels] does not "
            f"declare (declared: {sorted(manifest.labels)}); add them to [labels], "
            "e.g. normal = 0, glaucoma = 1"
        )


class PatientIds:
    """Patient id of an image: its file stem, or the first group of ``patient_regex``."""

    def __init__(self, manifest: SiteManifest) -> None:
        text = manifest.layout_options.get("patient_regex")
        self.pattern: re.Pattern[str] | None = None
        if text is None:
            return
        if not isinstance(text, str):
            raise ManifestError(f"{where(manifest)}: layout_options.patient_regex must be a string")
        try:
            self.pattern = re.compile(text)
        except re.error as exc:
            raise ManifestError(
                f"{where(manifest)}: layout_options.patient_regex {text!r} is not a valid "
                f"regular expression ({exc})"
            ) from exc
        if self.pattern.groups < 1:
            raise ManifestError(
                f"{where(manifest)}: layout_options.patient_regex {text!r} needs a group, "
                r"e.g. '^(P\d+)_' , whose match is the patient id"
            )

    def __call__(self, path: Path) -> tuple[str, Problem | None]:
        """The patient id, and a problem when the regex does not match (then the stem is used)."""
        if self.pattern is None:
            return path.stem, None
        match = self.pattern.search(path.name)
        if match is None or not match.group(1):
            return path.stem, Problem(
                str(path),
                f"patient_regex {self.pattern.pattern!r} does not match this file name; "
                "its stem is used as the patient id",
                "fix layout_options.patient_regex so that its first group finds the patient id",
            )
        return match.group(1), None


def is_clutter(path: Path) -> bool:
    """Hidden files and OS bookkeeping files, which no layout uses."""
    return path.name.startswith(".") or path.name.lower() in OS_CLUTTER


def list_images(folder: Path) -> tuple[list[Path], list[Problem], list[Problem]]:
    """Image files directly in ``folder`` (sorted), problems, and warnings for stray files.

    A sub-folder among the images is a problem (its images would silently be left out); a file
    that is not an image (``notes.txt``, ``Thumbs.db``, ``.DS_Store``) is ignored with a warning.
    """
    images: list[Path] = []
    problems: list[Problem] = []
    strays: list[Problem] = []
    for path in sorted(folder.iterdir()):
        if path.is_file():
            if path.suffix.lower() in IMAGE_SUFFIXES and not is_clutter(path):
                images.append(path)
            else:
                strays.append(Problem(str(path), STRAY_FILE))
        elif (kind := special_kind(path)) is not None:
            problems.append(
                Problem(
                    str(path),
                    f"not a regular file ({kind}); ignored",
                    "replace it with the image file itself, or remove it",
                )
            )
        elif not is_clutter(path):
            problems.append(
                Problem(
                    str(path),
                    "unexpected folder among the images; ignored",
                    f"images must be {sorted(IMAGE_SUFFIXES)} files directly in {folder}",
                )
            )
    return images, problems, strays


def scan_class_folders(
    manifest: SiteManifest,
    folder: Path,
    split: Split | None,
    patient_ids: PatientIds,
    class_of_folder: Mapping[str, str] | None = None,
) -> LayoutScan:
    """Records of ``folder/<class>/<image>``; folder names map to classes via ``class_of_folder``.

    Without a mapping a folder name must itself be a class declared in [labels].
    """
    out = LayoutScan([], [])
    for sub in sorted(folder.iterdir()):
        if not sub.is_dir():
            out.warnings.append(Problem(str(sub), STRAY_FILE, f"put images in {folder}/<class>/"))
            continue
        if is_clutter(sub):
            continue
        class_name = class_of_folder.get(sub.name) if class_of_folder else sub.name
        if class_name is None or class_name not in manifest.labels:
            out.problems.append(_undeclared_class(manifest, sub, class_of_folder))
            continue
        images, problems, strays = list_images(sub)
        out.problems.extend(problems)
        out.warnings.extend(strays)
        if not images:
            out.problems.append(
                Problem(str(sub), "class folder is empty", "add its images or remove the folder")
            )
        for image in images:
            out.records.append(
                make_record(manifest, image, class_name, split, patient_ids, out.problems)
            )
    return out


def _undeclared_class(
    manifest: SiteManifest, sub: Path, class_of_folder: Mapping[str, str] | None
) -> Problem:
    if class_of_folder is not None:
        return Problem(
            str(sub),
            "folder is not listed in layout_options.class_folders; its images are not used",
            f"map it to a class, e.g. class_folders = {{{sub.name!r} = 'glaucoma', ...}}",
        )
    return Problem(
        str(sub),
        f"class folder {sub.name!r} is not declared in [labels] "
        f"(declared: {sorted(manifest.labels)}); its images are not used",
        f"add {sub.name} = <index> to [labels] of {where(manifest)}, or rename the folder",
    )


def make_record(
    manifest: SiteManifest,
    image: Path,
    class_name: str,
    split: Split | None,
    patient_ids: PatientIds,
    problems: list[Problem],
) -> Record:
    """A fundus image record; a patient-id problem, if any, is appended to ``problems``."""
    patient_id, problem = patient_ids(image)
    if problem is not None:
        problems.append(problem)
    return Record(
        path=image,
        label=manifest.labels[class_name],
        patient_id=patient_id,
        split=split,
        meta={"source_file": image.name, "class_name": class_name},
    )


def parse_split(manifest: SiteManifest, value: object, setting: str) -> Split:
    """A split name from the manifest, or ManifestError listing the valid ones."""
    try:
        return Split(str(value).lower())
    except ValueError:
        raise ManifestError(
            f"{where(manifest)}: {setting} = {value!r} is not a split; "
            f"use one of {[s.value for s in Split]}"
        ) from None


def cell_text(value: object) -> str:
    """A table cell as text; whole numbers from spreadsheets (1, 1.0) read as '1'."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def resolve_under(root: Path, name: str) -> Path:
    """A path from the manifest, relative to the site root unless absolute."""
    path = Path(name).expanduser()
    return path if path.is_absolute() else root / path


def is_inside(root: Path, path: Path) -> bool:
    """Whether ``path`` (links and ``..`` resolved) lies under the site root ``root``."""
    return path.resolve().is_relative_to(root.resolve())


def resolve_inside(manifest: SiteManifest, name: str, setting: str) -> Path:
    """A path from [layout_options] under the site root; ManifestError when it leads outside.

    A site's data, label tables included, stays under its root, so that checking the root
    checks everything the site shares.
    """
    path = resolve_under(manifest.root, name)
    if not is_inside(manifest.root, path):
        raise ManifestError(
            f"{where(manifest)}: {setting} = {name!r} points outside the site root "
            f"{manifest.root}; move the file under the root and give its path relative to it"
        )
    return path


def read_table(
    path: Path, columns: Iterable[str], optional: Iterable[str] = ()
) -> list[dict[str, str]]:
    """Rows of a .csv or .xlsx table as text: ``columns`` must be present, ``optional`` may be."""
    columns = list(columns)
    require_regular(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        header, rows = _read_csv(path)
    elif suffix in (".xlsx", ".xlsm"):
        header, rows = _read_xlsx(path)
    else:
        raise DataError(f"{path}: label tables must be .csv or .xlsx, not {suffix or 'no suffix'}")
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(
            f"{path}: column(s) {missing} not found; the header has {header}. "
            f"{_delimiter_hint(header)}Fix the header or the column names in the manifest"
        )
    index = {c: header.index(c) for c in [*columns, *(c for c in optional if c in header)]}
    table = []
    for row in rows:
        cells = [cell_text(v) for v in row]
        if not any(cells):
            continue  # blank lines at the end of spreadsheets are common, and carry nothing
        cells += [""] * (len(header) - len(cells))
        table.append({c: cells[i] for c, i in index.items()})
    return table


def _delimiter_hint(header: list[str]) -> str:
    """A hint when a one-column header looks split by another delimiter than the comma."""
    if len(header) == 1:
        for mark, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
            if mark in header[0]:
                return f"The file seems to separate columns with {name}: save it comma-separated. "
    return ""


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        # utf-8-sig: spreadsheet programs often prepend a byte-order mark
        with path.open(newline="", encoding="utf-8-sig") as handle:
            lines = list(csv.reader(handle))
    except PermissionError as exc:
        raise DataError(permission_denied(path)) from exc
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}: not UTF-8 text ({exc}); save the CSV file with UTF-8 encoding"
        ) from exc
    except (OSError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read this CSV file ({exc})") from exc
    if not lines:
        raise DataError(f"{path}: the CSV file is empty; it needs a header row")
    return [h.strip() for h in lines[0]], lines[1:]


def _unsafe_xml_reason() -> str | None:
    """Why openpyxl's XML parsing is not safe on untrusted files here, or None when it is.

    openpyxl uses defusedxml when it is installed. Without it, the standard library's expat
    parser guards against entity-expansion attacks from version 2.4.1 on; lxml does not.
    """
    import pyexpat

    import openpyxl

    if getattr(openpyxl, "DEFUSEDXML", False):
        return None
    if getattr(openpyxl, "LXML", False):
        return "openpyxl parses with lxml here, and defusedxml (which guards it) is not installed"
    if pyexpat.version_info < (2, 4, 1):
        version = ".".join(map(str, pyexpat.version_info))
        return (
            f"the XML parser (expat {version}) does not guard against entity-expansion attacks, "
            "and defusedxml is not installed"
        )
    return None


def _check_xlsx_archive(path: Path) -> None:
    """Refuse an .xlsx file that is not a zip archive, or that unpacks to a bomb."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(
            f"{path}: not an Excel .xlsx workbook (not a zip archive: {exc}); save the table "
            "as .xlsx or .csv again"
        ) from exc
    if unpacked > MAX_XLSX_UNPACKED:
        raise DataError(
            f"{path}: the workbook unpacks to {unpacked / 1e6:.0f} MB, more than a label table "
            f"can need ({MAX_XLSX_UNPACKED / 1e6:.0f} MB at most); save the table as .csv"
        )


def _read_xlsx(path: Path) -> tuple[list[str], list[list[object]]]:
    reason = _unsafe_xml_reason()
    if reason is not None:
        raise DataError(
            f"{path}: Excel tables are refused because {reason}; install it "
            "(pip install defusedxml) or save the table as .csv and name that file instead"
        )
    _check_xlsx_archive(path)
    from openpyxl import load_workbook  # imported here: only xlsx label files need it

    try:
        workbook = load_workbook(path, read_only=True, data_only=True)
        try:
            rows = [list(r) for r in workbook.worksheets[0].iter_rows(values_only=True)]
        finally:
            workbook.close()
    except PermissionError as exc:
        raise DataError(permission_denied(path)) from exc
    except Exception as exc:  # openpyxl raises many unrelated types on damaged files
        raise DataError(f"{path}: cannot read this Excel file ({exc})") from exc
    if not rows:
        raise DataError(f"{path}: the first sheet is empty; it needs a header row")
    return [cell_text(h) for h in rows[0]], rows[1:]


PatientLabels = dict[str, tuple[int, dict[str, str]]]
LINE = "#line"  # the key under which a label row keeps its line number in the table


def read_patient_labels(
    manifest: SiteManifest, path: Path, optional: tuple[str, ...] = ()
) -> tuple[PatientLabels | None, list[Problem]]:
    """A ``patient_id,label[,optional...]`` table -> {patient: (label index, row)}, and problems.

    The labels are None when the table itself is missing or unreadable.
    """
    hint = f"write {path} with the header 'patient_id,label' and one row per patient"
    if not path.is_file():
        return None, [Problem(str(path), "label file not found; no scan can be labelled", hint)]
    try:
        rows = read_table(path, ["patient_id", "label"], optional=optional)
    except DataError as exc:
        return None, [Problem(str(path), str(exc).removeprefix(f"{path}: "), hint)]
    labels: PatientLabels = {}
    problems: list[Problem] = []
    for line, row in enumerate(rows, start=2):
        patient, value = row["patient_id"], row["label"]
        if not patient:
            problems.append(Problem(f"{path}:{line}", "row without a patient_id; ignored"))
        elif value not in manifest.labels:
            problems.append(_undeclared_label(manifest, path, line, patient, value))
        elif patient in labels:
            problems.append(
                Problem(f"{path}:{line}", f"patient {patient!r} is listed again; first row kept")
            )
        else:
            labels[patient] = (manifest.labels[value], {**row, LINE: str(line)})
    return labels, problems


def labels_file(manifest: SiteManifest) -> Path:
    """The CT layouts' ``patient_id,label`` table: layout_options.labels_file or labels.csv."""
    name = manifest.layout_options.get("labels_file", "labels.csv")
    if not isinstance(name, str) or not name:
        raise ManifestError(
            f"{where(manifest)}: layout_options.labels_file must be a file name, e.g. 'labels.csv'"
        )
    return resolve_inside(manifest, name, "layout_options.labels_file")


def _undeclared_label(
    manifest: SiteManifest, path: Path, line: int, patient: str, value: str
) -> Problem:
    return Problem(
        f"{path}:{line}",
        f"patient {patient!r} has label {value!r}, which [labels] does not declare "
        f"(declared: {sorted(manifest.labels)}); the patient is not used",
        f"fix the label, or add {value or '<name>'} = <index> to [labels] of {where(manifest)}",
    )


def match_label_rows(
    rows: Iterable[Mapping[str, str]],
    images: list[Path],
    where: tuple[Path | str, Path],
    columns: tuple[str, str],
    accept: Callable[[str, Path, str, str], bool],
    problems: list[Problem],
    what: str = "label",
) -> None:
    """Match each row of a label table (``where``: the table and the image folder) to the
    image it names, by file name or, for a name without a suffix, by stem. A row naming no
    image, or an image an accepted row already named, is a problem; ``accept(place, image,
    name, value)`` takes the others or refuses them (saying why in ``problems`` itself). Every
    image no accepted row names is a problem too ("image has no {what} in TABLE")."""
    table, folder = where
    by_name = {p.name: p for p in images}
    by_stem = {p.stem: p for p in images}
    labelled: set[Path] = set()
    for line, row in enumerate(rows, start=2):
        name, value = row[columns[0]], row[columns[1]]
        image = by_name.get(name) or (by_stem.get(name) if not Path(name).suffix else None)
        place = f"{table}:{line}"
        if image is None:
            missing = f"names image {name!r}, which does not exist in {folder}"
            problems.append(Problem(place, missing))
        elif image in labelled:
            problems.append(Problem(place, f"image {name!r} is listed again; first row kept"))
        elif accept(place, image, name, value):
            labelled.add(image)
    problems.extend(
        Problem(str(p), f"image has no {what} in {table}; not used", f"add a row for {p.name}")
        for p in images
        if p not in labelled
    )


def site_files(root: Path) -> tuple[list[Path], list[Problem]]:
    """Every file under ``root`` (sorted), following linked folders as a hospital's storage
    often lays them out, and a problem for each link that leads back into a folder already on
    its path (a loop: its files would be listed again and again, so it is not followed) and
    each linked folder that cannot be read."""
    files: list[Path] = []
    problems: list[Problem] = []

    def visit(folder: Path, seen: frozenset[str]) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError as exc:
            problems.append(
                Problem(str(folder), f"folder cannot be read ({exc.strerror or exc})",
                        "check the link and the folder's permissions")
            )  # fmt: skip
            return
        for path in entries:
            if path.is_dir():
                real = str(path.resolve())
                if real in seen:
                    problems.append(
                        Problem(
                            str(path),
                            f"a folder link that loops back to {real}; not followed",
                            "remove the link, or point it at a folder outside the site's own",
                        )
                    )
                    continue
                visit(path, seen | {real})
            elif path.is_file():
                files.append(path)

    visit(root, frozenset({str(root.resolve())}))
    return sorted(files), problems
