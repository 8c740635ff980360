"""The bad-input corpus, data and manifest cases (see tests/badinput.py for the policy)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.badinput import Case, Shared, check
from tests.realfiles import write_ct_slice


def _manifest_edit(old: str, new: str, site: str | None = None):
    """`sites check` on one site whose manifest has ``old`` replaced by ``new``."""

    def make(tmp, s: Shared) -> list[str]:
        data = s.copy_data(tmp)
        manifest = sorted((data / "sites").glob(f"{site or '*'}.toml"))[0]
        text = manifest.read_text(encoding="utf-8")
        assert old in text, text
        manifest.write_text(text.replace(old, new, 1), encoding="utf-8")
        return ["sites", "check", manifest, "--cache-dir", tmp / "cache"]

    return make


def _manifest_append(section: str, line: str):
    def make(tmp, s: Shared) -> list[str]:
        data = s.copy_data(tmp)
        manifest = sorted((data / "sites").glob("*.toml"))[0]
        text = manifest.read_text(encoding="utf-8")
        manifest.write_text(text.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1))
        return ["sites", "check", manifest, "--cache-dir", tmp / "cache"]

    return make


ROOT = os.geteuid() == 0  # root reads every file: permission rows cannot be staged
not_root = pytest.mark.skipif(ROOT, reason="root can read files without read permission")


def _check(tmp: Path, *manifests: Path) -> list:
    return ["sites", "check", *manifests, "--cache-dir", tmp / "cache"]


def _site(name: str, edit: Callable[[Path], object]):
    """`sites check` on the synthetic site ``name`` after ``edit(root)`` changed its files."""

    def make(tmp: Path, s: Shared) -> list:
        data = s.copy_data(tmp)
        roots = {"acrima": "ACRIMA", "refuge": "REFUGE", "rimone": "RIM-ONE_DL"}
        edit(data / roots[name])
        return _check(tmp, data / "sites" / f"{name}.toml")

    return make


def _acrima(edit: Callable[[Path], object]):
    return _site("acrima", edit)


def _first(root: Path, pattern: str = "*.jpg") -> Path:
    return sorted(root.glob(pattern))[0]


def _save(path: Path, pixels: np.ndarray, mode: str | None = None) -> None:
    Image.fromarray(pixels, mode=mode).save(path)


def _replace_with(name: str, pixels: np.ndarray, mode: str | None = None, n: int = 1):
    """Replace the first ``n`` ACRIMA photos by PNGs of ``pixels`` named ``name`` + index."""

    def edit(root: Path) -> None:
        for i, path in enumerate(sorted(root.glob("*.jpg"))[:n]):
            path.unlink()  # each copy a little different: byte-identical files are another case
            _save(root / f"{name}{i}_{path.stem}.png", np.roll(pixels, i, axis=0), mode)

    return edit


def _png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims ``width`` x ``height`` pixels (a decompression bomb)."""
    buffer = io.BytesIO()
    Image.new("L", (8, 8)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def _write_bomb(width: int, height: int):
    def edit(root: Path) -> None:
        (root / "Im900_huge_ACRIMA.png").write_bytes(_png_claiming(width, height))

    return edit


def _chmod(pattern: str, mode: int):
    def edit(root: Path) -> None:
        _first(root, pattern).chmod(mode)

    return edit


def _truncate(root: Path) -> None:
    path = _first(root)
    path.write_bytes(path.read_bytes()[:300])


def _copy_image(root: Path) -> None:
    a = sorted(root.glob("*.jpg"))
    shutil.copyfile(a[0], root / "Im500_copy_ACRIMA.jpg")
    shutil.copyfile(a[1], root / "Im501_copy_ACRIMA.jpg")


def _everyday_photos(root: Path) -> None:
    """The first four ACRIMA photos replaced by an astronaut, a coffee cup, a cat and a rocket
    (same names, so their labels stay)."""
    from skimage import data

    pictures = (data.astronaut(), data.coffee(), data.chelsea(), data.rocket())
    for path, pixels in zip(sorted(root.glob("*.jpg")), pictures, strict=False):
        Image.fromarray(pixels).convert("RGB").save(path, format="JPEG")


def _site_copied_as_another(tmp: Path, s: Shared) -> list:
    """ACRIMA and a second site whose folder is a byte-for-byte copy of it."""
    data = s.copy_data(tmp)
    shutil.copytree(data / "ACRIMA", data / "ACRIMA_COPY")
    first = data / "sites" / "acrima.toml"
    other = data / "sites" / "acrima_copy.toml"
    text = first.read_text(encoding="utf-8").replace('id = "acrima"', 'id = "copy"', 1)
    other.write_text(text.replace(str(data / "ACRIMA"), str(data / "ACRIMA_COPY")), "utf-8")
    return _check(tmp, first, other)


def _rimone_copy_across_splits(root: Path) -> None:
    base = root / "partitioned_by_hospital"
    train = _first(base / "training_set" / "normal", "*.png")
    shutil.copyfile(train, base / "test_set" / "normal" / "leaked_copy.png")


def _strays(root: Path) -> None:
    for name in (".DS_Store", "Thumbs.db", "notes.txt"):
        (root / name).write_text("not an image")


def _refuge_csv(text: str | bytes):
    def edit(root: Path) -> None:
        path = root / "Test400-GT" / "labels.csv"
        if isinstance(text, bytes):
            path.write_bytes(text)
            return
        names = sorted(p.name for p in (root / "Test400").iterdir())
        path.write_text(text.format(*names), encoding="utf-8")

    return edit


def _refuge_test_rows(root: Path, *, extra: str = "", skip: int = 0, sep: str = ",") -> str:
    names = sorted(p.name for p in (root / "Test400").iterdir())
    rows = [f"ImgName{sep}Glaucoma Label"] + [f"{n}{sep}{i % 2}" for i, n in enumerate(names)]
    return "\n".join(rows[: len(rows) - skip]) + "\n" + extra


def _refuge_table(**kw):
    def edit(root: Path) -> None:
        text = _refuge_test_rows(root, **kw)
        (root / "Test400-GT" / "labels.csv").write_text(text, encoding=kw.get("enc", "utf-8"))

    return edit


def _refuge_disc_columns(x: str, y: str = "20", *, crop: bool = False):
    """`sites check` on REFUGE whose test table gives disc x/y columns, the first row's
    ``x``/``y`` as given (the others inside the photo); ``crop``: with a disc crop."""

    def make(tmp: Path, s: Shared) -> list:
        data = s.copy_data(tmp)
        manifest = data / "sites" / "refuge.toml"
        text = manifest.read_text(encoding="utf-8")
        columns = 'split = "test"\ndisc_x_column = "Disc_X"\ndisc_y_column = "Disc_Y"\n'
        text = text.replace('split = "test"\n', columns, 1)
        if crop:
            text = text.replace("[preprocess]\n", "[preprocess]\ndisc_crop = 0.4\n", 1)
        manifest.write_text(text, encoding="utf-8")
        root = data / "REFUGE"
        names = sorted(p.name for p in (root / "Test400").iterdir())
        rows = ["ImgName,Glaucoma Label,Disc_X,Disc_Y", f"{names[0]},0,{x},{y}"]
        rows += [f"{n},{i % 2},20,20" for i, n in enumerate(names[1:])]
        (root / "Test400-GT" / "labels.csv").write_text("\n".join(rows) + "\n")
        return _check(tmp, manifest)

    return make


def _refuge_mask(edit: Callable[[Path], object]):
    """REFUGE with the first test photo's disc mask changed by ``edit(mask)``."""

    def change(root: Path) -> None:
        edit(sorted((root / "Disc_Cup_Masks" / "Test400").glob("*.png"))[0])

    return _site("refuge", change)


def _refuge_bom(root: Path) -> None:
    text = _refuge_test_rows(root)
    (root / "Test400-GT" / "labels.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())


def _refuge_latin1(root: Path) -> None:
    text = _refuge_test_rows(root) + "caf\xe9.jpg,1\n"
    (root / "Test400-GT" / "labels.csv").write_bytes(text.encode("latin-1"))


def _refuge_xlsx(edit_xml: Callable[[str], str] | None = None, raw: bytes | None = None):
    """Rewrite REFUGE's validation workbook: ``raw`` bytes, or its first sheet's XML edited."""

    def edit(root: Path) -> None:
        path = root / "Validation400-GT" / "labels.xlsx"
        if raw is not None:
            path.write_bytes(raw)
            return
        with zipfile.ZipFile(path) as source:
            parts = {n: source.read(n) for n in source.namelist()}
        sheet = next(n for n in parts if n.startswith("xl/worksheets/sheet"))
        parts[sheet] = edit_xml(parts[sheet].decode()).encode()
        with zipfile.ZipFile(path, "w") as target:
            for name, data in parts.items():
                target.writestr(name, data)

    return edit


def _entity_bomb(xml: str) -> str:
    """A 'billion laughs' DTD in front of the sheet, its last entity used in a cell."""
    lol = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)
    ]
    start = xml.index("?>") + 2 if xml.startswith("<?xml") else 0
    cell = '<row r="99"><c r="A99" t="inlineStr"><is><t>&lol9;</t></is></c></row>'
    body = xml[start:].replace("</sheetData>", cell + "</sheetData>", 1)
    return xml[:start] + f"<!DOCTYPE worksheet [{''.join(lol)}]>" + body


def _manifest_text(root: Path, layout: str, options: str = "") -> str:
    return (
        f'id = "ct_site"\nmodality = "ct"\nlayout = "{layout}"\nroot = "{root}"\n\n'
        "[labels]\nbenign = 0\nmalignant = 1\n\n[preprocess]\nshape = [4, 8, 8]\n"
        f"{options}"
    )


def _dicom_slice(path: Path, pixels: np.ndarray, z: float, patient: str, uid: str, **kw) -> None:
    write_ct_slice(path, pixels, position=(0.0, 0.0, z), patient_id=patient, series_uid=uid, **kw)


N_CT = 6  # patients in a small CT site: three per class, so that every split gets some


def _dicom_site(break_it: Callable[[Path], object] | None = None, options: str = ""):
    """`sites check` on a small DICOM site (N_CT patients, 3 slices each) after ``break_it``."""

    def make(tmp: Path, s: Shared) -> list:
        root = tmp / "CT_DICOM"
        for k in range(N_CT):
            uid = f"1.2.826.0.1.3680043.8.498.{k + 1}"
            for z in range(3):
                pixels = np.full((6, 5), 1000 + 10 * z + k, dtype=np.int16)
                _dicom_slice(root / f"P{k}" / f"s{z}.dcm", pixels, 2.5 * z, f"P{k}", uid)
        labels = "".join(f"P{k},{('benign', 'malignant')[k % 2]}\n" for k in range(N_CT))
        (root / "labels.csv").write_text("patient_id,label\n" + labels)
        if break_it is not None:
            break_it(root)
        manifest = tmp / "ct_site.toml"
        manifest.write_text(_manifest_text(root, "dicom", options))
        return _check(tmp, manifest)

    return make


def _nan_slope(root: Path) -> None:
    _dicom_slice(root / "P1" / "s1.dcm", np.full((6, 5), 30000, np.int16), 2.5, "P1",
                 "1.2.826.0.1.3680043.8.498.2", slope=1e38)  # fmt: skip


def _missing_slice(root: Path) -> None:
    for z in (3, 5):  # P2 then has slices at 0, 2.5, 5, 7.5, 12.5 mm: 10 mm is missing
        _dicom_slice(root / "P2" / f"s{z}.dcm", np.zeros((6, 5), np.int16), 2.5 * z, "P2",
                     "1.2.826.0.1.3680043.8.498.3")  # fmt: skip


def _second_series(root: Path) -> None:
    _dicom_slice(root / "P3" / "extra.dcm", np.zeros((6, 5), np.int16), 0.0, "P3", "1.2.3.99")


def _truncated_pixels(root: Path) -> None:
    path = root / "P0" / "s1.dcm"
    path.write_bytes(path.read_bytes()[:-20])


def _nifti_site(break_it: Callable[[Path], object] | None = None, options: str = ""):
    """`sites check` on a small NIfTI site (N_CT patients), broken by ``break_it``."""

    def make(tmp: Path, s: Shared) -> list:
        import nibabel as nib

        root = tmp / "CT_NIFTI"
        root.mkdir()
        rng = np.random.default_rng(0)
        for k in range(N_CT):
            data = rng.normal(0, 100, size=(8, 8, 4)).astype(np.float32)
            nib.save(nib.Nifti1Image(data, np.diag([0.8, 0.8, 2.5, 1.0])), root / f"P{k}.nii.gz")
        labels = "".join(f"P{k},{('benign', 'malignant')[k % 2]}\n" for k in range(N_CT))
        (root / "labels.csv").write_text("patient_id,label\n" + labels)
        if break_it is not None:
            break_it(root)
        manifest = tmp / "ct_site.toml"
        manifest.write_text(_manifest_text(root, "nifti", options))
        return _check(tmp, manifest)

    return make


def _nifti_pixdim(value: float):
    def edit(root: Path) -> None:
        import nibabel as nib

        image = nib.Nifti1Image(np.ones((8, 8, 4), np.float32), np.eye(4))
        image.header["pixdim"][1:4] = [value, 1.0, 1.0]
        nib.save(image, root / "P1.nii.gz")

    return edit


def _nifti_data(data: np.ndarray):
    def edit(root: Path) -> None:
        import nibabel as nib

        nib.save(nib.Nifti1Image(data, np.eye(4)), root / "P1.nii.gz")

    return edit


def _zero_orientation(root: Path) -> None:
    import pydicom

    for path in (root / "P1").glob("*.dcm"):
        ds = pydicom.dcmread(path)
        ds.ImageOrientationPatient = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.save_as(path, enforce_file_format=True)


def _nifti_flat_sform(root: Path) -> None:
    import nibabel as nib

    image = nib.Nifti1Image(np.ones((8, 8, 4), np.float32), None)
    image.set_sform(np.diag([0.8, 0.0, 2.5, 1.0]), code=1)  # the y axis points nowhere
    nib.save(image, root / "P1.nii.gz")


def _nifti_without_orientation(root: Path) -> None:
    import nibabel as nib

    image = nib.Nifti1Image(np.ones((8, 8, 4), np.float32), np.diag([0.8, 0.8, 2.5, 1.0]))
    image.set_qform(None, code=0)
    image.set_sform(None, code=0)
    nib.save(image, root / "P1.nii.gz")


def _gzip_truncated(root: Path) -> None:
    path = root / "P1.nii.gz"
    path.write_bytes(path.read_bytes()[:-60])


def _labels_csv(text: str):
    def edit(root: Path) -> None:
        (root / "labels.csv").write_text(text)

    return edit


def _outside_file(absolute: bool):
    def edit(root: Path) -> None:
        outside = root.parent / "elsewhere.nii.gz"
        shutil.copyfile(root / "P1.nii.gz", outside)
        (root / "P1.nii.gz").unlink()
        name = str(outside) if absolute else "../elsewhere.nii.gz"
        (root / "labels.csv").write_text(
            f"patient_id,label,file\nP0,benign,P0.nii.gz\nP1,malignant,{name}\n"
            "P2,benign,P2.nii.gz\nP3,malignant,P3.nii.gz\nP4,benign,P4.nii.gz\n"
            "P5,malignant,P5.nii.gz\n"
        )

    return edit


def _two_manifests(same_file: bool):
    def make(tmp: Path, s: Shared) -> list:
        data = s.copy_data(tmp)
        first = data / "sites" / "acrima.toml"
        if same_file:
            return _check(tmp, first, first)
        other = data / "sites" / "refuge.toml"
        other.write_text(other.read_text().replace('id = "refuge"', 'id = "acrima"'))
        return _check(tmp, first, other)

    return make


def _card_with_same_id(tmp: Path, s: Shared) -> list:
    data = s.copy_data(tmp)
    other = data / "sites" / "rimone.toml"
    other.write_text(other.read_text().replace('id = "rimone"', 'id = "acrima"'))
    return ["sites", "card", data / "sites" / "acrima.toml", "--other", other,
            "--out-dir", tmp / "cards", "--cache-dir", tmp / "cache"]  # fmt: skip


def _cache_is_a_file(tmp: Path, s: Shared) -> list:
    data = s.copy_data(tmp)
    (tmp / "cache").write_text("a file, not a folder")
    return _check(tmp, data / "sites" / "acrima.toml")


def _cache_read_only(tmp: Path, s: Shared) -> list:
    data = s.copy_data(tmp)
    (tmp / "cache").mkdir()
    (tmp / "cache").chmod(0o500)
    return _check(tmp, data / "sites" / "acrima.toml")


def _manifest_root(site: str, root: str):
    """`sites check` on ``site`` with its root pointed at another site's folder."""

    def make(tmp: Path, s: Shared) -> list:
        data = s.copy_data(tmp)
        manifest = data / "sites" / f"{site}.toml"
        text = re.sub(r'root = ".*"', f'root = "../{root}"', manifest.read_text())
        manifest.write_text(text)
        return _check(tmp, manifest)

    return make


def _empty_root(tmp: Path, s: Shared) -> list:
    data = s.copy_data(tmp)
    for path in (data / "ACRIMA").iterdir():
        path.unlink()
    return _check(tmp, data / "sites" / "acrima.toml")


def _mixed_sizes(root: Path) -> None:
    path = _first(root)
    with Image.open(path) as image:
        image.resize((300, 260)).save(path)


def _rimone(rel: str, action: str):
    def edit(root: Path) -> None:
        path = root / "partitioned_by_hospital" / rel
        if action == "empty":
            for image in path.iterdir():
                image.unlink()
        elif action == "mkdir":
            path.mkdir()
            shutil.copyfile(_first(root / "partitioned_by_hospital/training_set/normal", "*.png"),
                            path / "x.png")  # fmt: skip
        elif action == "file":
            path.write_text("readme")

    return edit


_GRADIENT = np.dstack([np.add.outer(np.arange(80), np.arange(80)).astype(np.uint8)] * 3)

NON_UTF8 = os.fsdecode(b"Im777_g_ACRIMA\xff.jpg")
NEWLINE = "Im778_g\n[READY] all files verified.jpg"


def _named(name: str, *, text: bool = False):
    """A copy of the first image (or a text file) saved under the file name ``name``."""

    def edit(root: Path) -> None:
        if text:
            (root / name).write_text("not a photo")
        else:
            shutil.copy(_first(root), root / name)

    return edit


def _special(name: str, kind: str):
    """A FIFO, or a link to /dev/zero, named like an image."""

    def edit(root: Path) -> None:
        if kind == "fifo":
            os.mkfifo(root / name)
        else:
            (root / name).symlink_to("/dev/zero")

    return edit


def _card_non_utf8(tmp: Path, s: Shared) -> list:
    data = s.copy_data(tmp)
    _named(NON_UTF8, text=True)(data / "ACRIMA")
    return ["sites", "card", data / "sites" / "acrima.toml", "--out-dir", tmp / "cards",
            "--cache-dir", tmp / "cache"]  # fmt: skip


CASES = [
    Case("roi_crop is a string", _manifest_append("preprocess", 'roi_crop = "no"'), 2,
         ("roi_crop", "true or false")),
    Case("normalize is a string", _manifest_append("preprocess", 'normalize = "yes"'), 2,
         ("normalize", "true or false")),
    Case("use_layout_split is a number", _manifest_append("split", "use_layout_split = 1"), 2,
         ("use_layout_split", "true or false")),
    Case("a TRIPOD+AI field that is not text",
         _manifest_edit('data_dates = "generated on demand; no acquisition dates"',
                        "data_dates = 2019", "acrima"),
         2, ("acrima.toml", "'data_dates' must be a string")),
    Case("split seed is text", _manifest_edit("seed = 0", 'seed = "abc"'), 2,
         ("seed", "an integer")),
    Case("image_size is fractional", _manifest_edit("image_size = 64", "image_size = 64.5"), 2,
         ("image_size", "an integer")),
    Case("roi_threshold is text", _manifest_append("preprocess", 'roi_threshold = "x"'), 2,
         ("roi_threshold", "a number")),
    Case("val_fraction is a bool", _manifest_append("split", "val_fraction = true"), 2,
         ("val_fraction", "a number")),
    Case("labels share one index", _manifest_edit("glaucoma = 1", "glaucoma = 0"), 2,
         ("[labels]", "same index")),
    # --- images that are not photographs, or that this user cannot read
    Case("image header claims over 100 megapixels", _acrima(_write_bomb(12_000, 9_000)), 1,
         ("Im900_huge_ACRIMA.png", "108 megapixels", "at most 100")),
    Case("image header claims a decompression bomb", _acrima(_write_bomb(40_000, 40_000)), 1,
         ("Im900_huge_ACRIMA.png", "too large to decode safely")),
    Case("all-black image", _acrima(_replace_with("black", np.zeros((40, 40, 3), np.uint8))), 1,
         ("no camera field found in", "black0_", "all black")),
    Case("single-colour image",
         _acrima(_replace_with("grey", np.full((40, 40, 3), 128, np.uint8))), 1,
         ("no camera field found in", "grey0_", "single colour")),
    Case("nearly black image (compression noise only)",
         _acrima(_replace_with("dark", (_GRADIENT % 4).astype(np.uint8))), 1,
         ("no camera field found in", "dark0_", "all black")),
    Case("image file with text inside", _acrima(lambda r: _first(r).write_text("hello")), 1,
         ("Im001_g_ACRIMA.jpg", "not a readable image format")),
    Case("zero-byte image file", _acrima(lambda r: _first(r).write_bytes(b"")), 1,
         ("Im001_g_ACRIMA.jpg", "not a readable image format")),
    Case("truncated JPEG", _acrima(_truncate), 1,
         ("Im001_g_ACRIMA.jpg", "truncated or corrupt")),
    # --- images medfed converts: warned about with counts and names, the site stays ready
    Case("grayscale images in a fundus site",
         _acrima(_replace_with("grey", _GRADIENT[..., 0], n=3)), 0,
         ("3 grayscale image(s) (converted to RGB)", "grey0_", "grey2_")),
    Case("RGBA images in a fundus site",
         _acrima(_replace_with("alpha", np.dstack([_GRADIENT, _GRADIENT[..., :1]]), n=2)), 0,
         ("2 RGBA image(s) (transparency dropped)", "alpha0_", "alpha1_")),
    Case("16-bit images in a fundus site",
         _acrima(_replace_with("deep", _GRADIENT[..., 0].astype(np.uint16) * 256)), 0,
         ("1 16-bit image(s) (reduced to 8 bits)", "deep0_")),
    Case("images smaller than the model input",
         _acrima(_replace_with("tiny", _GRADIENT[:16, :16], n=2)), 0,
         ("2 tiny image(s)", "smaller than image_size 64", "tiny0_")),
    Case("images of different sizes in one site", _acrima(_mixed_sizes), 0,
         ("2 distinct sizes", "READY")),
    # --- files that do not belong in a site
    Case("stray non-image files among the images", _acrima(_strays), 0,
         ("3 file(s) not an image file; ignored", ".DS_Store", "Thumbs.db", "notes.txt")),
    Case("stray file in a RIM-ONE partition", _site("rimone", _rimone("notes.txt", "file")), 0,
         ("notes.txt", "not an image file")),
    Case("everyday photos in a fundus site", _acrima(_everyday_photos), 0,
         ("4 scan(s) do not look like fundus scans", "no dark surround", "not red to orange",
          "Im001_g_ACRIMA.jpg", "READY")),
    Case("a site whose files are another site's", _site_copied_as_another, 0,
         ("byte-identical to scans of site copy", "byte-identical to scans of site acrima",
          "same SHA-256", "ACRIMA_COPY", "both test sets")),
    Case("CT volumes without air (not in Hounsfield units)", _dicom_site(), 0,
         ("do not look like ct scans", "no air", "not Hounsfield units", "P0")),
    Case("byte-identical images under different names", _acrima(_copy_image), 0,
         ("2 set(s) of byte-identical scans", "Im500_copy_ACRIMA.jpg", "Im501_copy_ACRIMA.jpg",
          "one split")),
    Case("a copy of a training image in the test folder",
         _site("rimone", _rimone_copy_across_splits), 1,
         ("byte-identical", "leaked_copy.png", "one split")),
    Case("empty class folder", _site("rimone", _rimone("test_set/glaucoma", "empty")), 1,
         ("test_set/glaucoma", "class folder is empty")),
    Case("class folder not declared in labels",
         _site("rimone", _rimone("test_set/suspect", "mkdir")), 1,
         ("suspect", "not declared in [labels]")),
    Case("empty site folder", _empty_root, 1, ("ACRIMA", "no images found")),
    Case("acrima manifest pointed at a RIM-ONE folder", _manifest_root("acrima", "RIM-ONE_DL"), 1,
         ("partitioned_by_hospital", "unexpected folder", "no images found")),
    Case("refuge manifest pointed at an ACRIMA folder", _manifest_root("refuge", "ACRIMA"), 1,
         ("Training400", "is missing")),
    Case("patient_regex that matches no file name",
         _manifest_edit("[labels]", '[layout_options]\npatient_regex = "^(P\\\\d+)_"\n\n[labels]'),
         1,
         ("patient_regex", "does not match")),
    Case("patient_regex that is not a regular expression",
         _manifest_edit("[labels]", "[layout_options]\npatient_regex = '^(\\d+_'\n\n[labels]"),
         2,
         ("patient_regex", "is not a valid regular expression", "acrima.toml")),
    Case("patient_regex without a group for the patient id",
         _manifest_edit("[labels]", "[layout_options]\npatient_regex = '^\\d+_'\n\n[labels]"),
         2,
         ("patient_regex", "needs a group", "patient id")),
    Case("patient_regex that is not a string",
         _manifest_edit("[labels]", "[layout_options]\npatient_regex = 3\n\n[labels]"),
         2,
         ("patient_regex must be a string",)),
    Case("scans of a class that classes_held leaves out",
         _manifest_edit("[labels]", 'classes_held = ["normal"]\n\n[labels]'),
         1,
         ("scan(s) of class 'glaucoma', which classes_held ['normal'] leaves out",
          "add 'glaucoma' to classes_held")),
    # --- label tables
    Case("label table naming an image that does not exist",
         _site("refuge", _refuge_table(extra="x.jpg,1\n")), 1,
         ("labels.csv:6", "'x.jpg'", "does not exist")),
    Case("label value that maps to no class",
         _site("refuge", _refuge_csv("ImgName,Glaucoma Label\n{0},7\n{1},0\n")), 1,
         ("labels.csv:2", "label value '7'")),
    Case("label table separated by semicolons", _site("refuge", _refuge_table(sep=";")), 1,
         ("labels.csv", "semicolons", "comma-separated")),
    Case("label table with a duplicated row",
         _site("refuge", _refuge_csv("ImgName,Glaucoma Label\n{0},1\n{0},1\n{1},0\n")), 1,
         ("labels.csv:3", "listed again")),
    Case("image without a label row", _site("refuge", _refuge_table(skip=1)), 1,
         ("has no label in", "labels.csv")),
    Case("label table with a byte-order mark", _site("refuge", _refuge_bom), 0, ("READY",)),
    Case("disc mask missing for a listed photo", _refuge_mask(Path.unlink), 1,
         ("T0001.jpg", "no disc mask named T0001", "disc_masks")),
    Case("disc mask of another size than its photo",
         _refuge_mask(lambda p: Image.new("L", (7, 5), 255).save(p)), 1,
         ("T0001.png", "7x5", "match its photo")),
    Case("disc mask without a disc", _refuge_mask(
        lambda p: Image.new("L", Image.open(p).size, 255).save(p)), 1,
         ("T0001.png", "no disc in it")),
    Case("disc position is not a number", _refuge_disc_columns("left"), 1,
         ("labels.csv:2", "Disc_X", "'left'", "not a number")),
    Case("disc position outside the photo", _refuge_disc_columns("9999", crop=True), 1,
         ("labels.csv:2", "(9999, 20)", "outside the")),
    Case("disc position given by one column only", _manifest_edit(
        'split = "test"\n', 'split = "test"\ndisc_x_column = "Disc_X"\n', "refuge"), 2,
         ("label_files[1]", "disc_y_column")),
    Case("label table not in UTF-8", _site("refuge", _refuge_latin1), 1,
         ("labels.csv", "UTF-8")),
    Case("empty label table", _site("refuge", _refuge_csv(b"")), 1, ("labels.csv", "empty")),
    Case("xlsx label table with an entity bomb", _site("refuge", _refuge_xlsx(_entity_bomb)), 1,
         ("labels.xlsx", "cannot read this Excel file")),
    Case("xlsx label table that is not a workbook",
         _site("refuge", _refuge_xlsx(raw=b"ImgName,Glaucoma Label\n")), 1,
         ("labels.xlsx", "not an Excel .xlsx workbook")),
    Case("label table path outside the site root",
         _manifest_edit('file = "Test400-GT/labels.csv"', 'file = "../../elsewhere.csv"', "refuge"),
         2,
         ("label_files[1].file", "points outside the site root")),
    # --- the cache and the manifests given
    Case("cache folder is a file", _cache_is_a_file, 2, ("cache", "is a file", "--cache-dir")),
    Case("two manifests with one site id", _two_manifests(same_file=False), 2,
         ("'acrima'", "acrima.toml", "refuge.toml")),
    Case("one manifest given twice", _two_manifests(same_file=True), 2,
         ("acrima.toml", "given twice")),
    Case("data card with another site of the same id", _card_with_same_id, 2,
         ("'acrima'", "rimone.toml")),
    # --- CT: DICOM
    Case("DICOM slice with infinite values after rescale", _dicom_site(_nan_slope), 1,
         ("P1/s1.dcm", "NaN or infinite", "RescaleSlope")),
    Case("DICOM series with a missing slice", _dicom_site(_missing_slice), 1,
         ("P2", "a slice is probably missing")),
    Case("DICOM patient with two series", _dicom_site(_second_series), 1,
         ("P3", "has another series")),
    Case("DICOM slice with truncated pixel data", _dicom_site(_truncated_pixels), 1,
         ("P0/s1.dcm", "pixel data cannot be decoded")),
    Case("DICOM series whose ImageOrientationPatient has a zero direction",
         _dicom_site(_zero_orientation), 1,
         ("P1/s", "ImageOrientationPatient", "parallel or zero axes")),
    Case("DICOM site without labels.csv", _dicom_site(lambda r: (r / "labels.csv").unlink()), 1,
         ("labels.csv", "label file not found")),
    Case("DICOM labels_file outside the site root",
         _dicom_site(options='\n[layout_options]\nlabels_file = "../labels.csv"\n'), 2,
         ("layout_options.labels_file", "points outside the site root")),
    # --- CT: NIfTI
    Case("NIfTI with zero pixdim", _nifti_site(_nifti_pixdim(0.0)), 1,
         ("P1.nii.gz", "pixdim", "zero, negative")),
    Case("NIfTI with negative pixdim", _nifti_site(_nifti_pixdim(-1.5)), 1,
         ("P1.nii.gz", "pixdim")),
    Case("NIfTI with NaN voxels", _nifti_site(_nifti_data(np.full((8, 8, 4), np.nan, np.float32))),
         1, ("P1.nii.gz", "NaN or infinite")),
    Case("NIfTI with four dimensions",
         _nifti_site(_nifti_data(np.zeros((8, 8, 4, 2), np.float32))), 1,
         ("P1.nii.gz", "must be 3-D")),
    Case("NIfTI whose sform has an axis without direction", _nifti_site(_nifti_flat_sform), 1,
         ("P1.nii.gz", "affine", "degenerate")),
    Case("NIfTI without qform or sform", _nifti_site(_nifti_without_orientation), 0,
         ("1 volume(s) have no orientation", "qform/sform")),
    Case("gzip-truncated .nii.gz", _nifti_site(_gzip_truncated), 1,
         ("P1.nii.gz", "not a readable NIfTI file")),
    Case("NIfTI label row pointing outside the root with ..", _nifti_site(_outside_file(False)), 1,
         ("labels.csv:3", "points outside the site root")),
    Case("NIfTI label row with an absolute path outside the root",
         _nifti_site(_outside_file(True)), 1,
         ("labels.csv:3", "points outside the site root")),
    Case("NIfTI site folder holding a symlink loop",
         _nifti_site(lambda r: [(r / "more").mkdir(), (r / "more" / "up").symlink_to(r)]), 1,
         ("more/up", "loops back to", "not followed", "remove the link")),
    Case("DICOM site folder holding a symlink loop",
         _dicom_site(lambda r: (r / "P0" / "again").symlink_to(r / "P0")), 1,
         ("P0/again", "loops back to", "not followed")),
    Case("stray files in a NIfTI site",
         _nifti_site(lambda r: [(r / n).write_text("about") for n in ("README.txt", ".DS_Store")]),
         0, ("2 file(s) not a *.nii / *.nii.gz file; ignored", "README.txt", ".DS_Store")),
    Case("NIfTI label naming an undeclared class",
         _nifti_site(_labels_csv("patient_id,label\nP0,benign\nP1,cancer\nP2,benign\n")), 1,
         ("labels.csv:3", "'cancer'", "does not declare")),
    Case("val_fraction = 0: no validation split", _manifest_append("split", "val_fraction = 0"),
         0, ("site acrima has no validation split", "val_fraction = 0", "threshold stays at 0.5",
             "no validation AUC")),
    Case("image name that is not UTF-8", _acrima(_named(NON_UTF8, text=True)), 1,
         ("Im777_g_ACRIMA\\xff.jpg", "not a readable image format")),
    Case("copy of an image under a name that is not UTF-8", _acrima(_named(NON_UTF8)), 0,
         ("byte-identical", "Im777_g_ACRIMA\\xff.jpg")),
    Case("image name with a newline", _acrima(_named(NEWLINE, text=True)), 1,
         ("Im778_g\\n[READY] all files verified.jpg", "not a readable image format")),
    Case("data card of a site with a file name that is not UTF-8", _card_non_utf8, 0,
         ("acrima.md",)),
    Case("empty --out-dir for a data card",
         lambda tmp, s: ["sites", "card", s.manifests()[0], "--out-dir", ""], 2,
         ("--out-dir", "is empty")),
    Case("empty --cache-dir for sites check",
         lambda tmp, s: ["sites", "check", s.manifests()[0], "--cache-dir", ""], 2,
         ("--cache-dir", "is empty")),
    Case("FIFO named like an image", _acrima(_special("Im801_g_ACRIMA.jpg", "fifo")), 1,
         ("Im801_g_ACRIMA.jpg", "not a regular file (a FIFO)")),
    Case("link to /dev/zero named like an image", _acrima(_special("Im800_ACRIMA.jpg", "zero")),
         1, ("Im800_ACRIMA.jpg", "not a regular file (a character device)")),
]  # fmt: skip

PERMISSION_CASES = [
    Case("image the user cannot read", _acrima(_chmod("*.jpg", 0)), 1,
         ("Im001_g_ACRIMA.jpg", "permission denied")),
    Case("label table the user cannot read", _site("refuge", _chmod("Test400-GT/*.csv", 0)), 1,
         ("labels.csv", "permission denied")),
    Case("site folder the user cannot list", _acrima(lambda r: r.chmod(0)), 2,
         ("ACRIMA", "permission denied")),
    Case("read-only cache folder", _cache_read_only, 2,
         ("cache", "cannot be written", "--cache-dir")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_data_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    check(case, tmp_path, shared)


@not_root
@pytest.mark.parametrize("case", PERMISSION_CASES, ids=str)
def test_unreadable_input_gets_a_clear_answer(case: Case, tmp_path, shared: Shared) -> None:
    try:
        check(case, tmp_path, shared)
    finally:  # let pytest clean the folder up
        for path in [tmp_path, *tmp_path.rglob("*")]:
            path.chmod(0o700)


def test_a_truncated_jpeg_is_named_once(tmp_path, shared: Shared) -> None:
    from typer.testing import CliRunner

    from medfed.cli import app

    argv = _acrima(_truncate)(tmp_path, shared)
    output = CliRunner().invoke(app, [str(a) for a in argv]).output
    assert output.count("Im001_g_ACRIMA.jpg") == 1, output


def test_xlsx_tables_are_refused_when_xml_parsing_is_unguarded(
    tmp_path, shared: Shared, monkeypatch
) -> None:
    import openpyxl

    monkeypatch.setattr(openpyxl, "DEFUSEDXML", False)
    monkeypatch.setattr(openpyxl, "LXML", True)
    case = Case("xlsx without a guarded XML parser", _site("refuge", lambda r: None), 1,
                ("labels.xlsx", "defusedxml", ".csv"))  # fmt: skip
    check(case, tmp_path, shared)


def test_byte_identical_scans_share_a_split() -> None:
    from medfed.config import SplitOptions
    from medfed.data.records import Record
    from medfed.data.splits import assign_splits

    records = [Record(Path(f"im{i}.png"), i % 2, f"p{i}") for i in range(40)]
    contents = [f"h{i}" for i in range(40)]
    contents[39] = contents[0]  # im39 is a copy of im0 under another name
    for seed in range(8):
        splits = assign_splits(records, SplitOptions(seed=seed), contents=contents)
        assert splits[39] == splits[0]
    # without copies the split is the patient split, as before
    plain = assign_splits(records, SplitOptions(), contents=[f"h{i}" for i in range(40)])
    assert plain == assign_splits(records, SplitOptions())


def test_file_names_are_escaped_in_reports_and_cards(tmp_path, shared: Shared) -> None:
    """A newline in a file name fakes no line of output; bytes that are not UTF-8 are escaped
    in the text report, the JSON report and the data card alike."""
    from typer.testing import CliRunner

    from medfed.cli import app

    data = shared.copy_data(tmp_path)
    _named(NEWLINE, text=True)(data / "ACRIMA")
    _named(NON_UTF8, text=True)(data / "ACRIMA")
    manifest = str(data / "sites" / "acrima.toml")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    text = CliRunner().invoke(app, ["sites", "check", manifest, *cache]).output
    assert not [line for line in text.splitlines() if line.startswith("[READY] all files")]
    assert "Im777_g_ACRIMA\\xff.jpg" in text
    report = CliRunner().invoke(app, ["sites", "check", "--json", manifest, *cache]).stdout
    files = [p["file"] for p in json.loads(report)[0]["problems"]]
    assert any(f.endswith("Im778_g\\n[READY] all files verified.jpg") for f in files), files
    assert any(f.endswith("Im777_g_ACRIMA\\xff.jpg") for f in files), files
    out = tmp_path / "cards"
    card = CliRunner().invoke(app, ["sites", "card", manifest, "--out-dir", str(out), *cache])
    assert card.exit_code == 0, card.output
    assert "Im777_g_ACRIMA\\xff.jpg" in (out / "acrima.md").read_text(encoding="utf-8")


def test_a_site_without_validation_scans_is_named_for_training(tmp_path, shared: Shared) -> None:
    """The words training prints for a site whose operating point falls back to 0.5."""
    from medfed.config import load_manifest
    from medfed.data.cache import TensorCache
    from medfed.data.sitedata import load_site, no_validation_warning

    argv = _manifest_append("split", "val_fraction = 0")(tmp_path, shared)
    site = load_site(load_manifest(argv[2]), TensorCache(tmp_path / "cache"))
    words = no_validation_warning(site, "youden")
    assert words is not None and "site acrima" in words and "0.5" in words and "youden" in words
    assert no_validation_warning(site, "threshold:0.3") is None
