"""Routing: answer a new patient scan (upload or path), see where it goes, review past scans.

The scan goes through ``medfed.clinic.route.route_files``, exactly as ``medfed route``
sends it, so every decision lands in the run's audit log before it is shown.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st

from medfed.clinic.kept import keep_scan
from medfed.clinic.pacs.instances import with_pacs_ids
from medfed.clinic.route import route_files
from medfed.core.errors import ConfigError, MedfedError
from medfed.core.units import human_bytes
from medfed.dashboard import MAX_UPLOAD_MB, charts, checks, clinical, common, rundata, thumbnails
from medfed.dashboard.rundata import Run
from medfed.reports import fmt
from medfed.routing.routers import default_router, make_router, routers_for

UPLOAD_TYPES = ["jpg", "jpeg", "png", "tif", "tiff", "bmp", "dcm", "nii", "gz"]
AUDIT_LIMIT = checks.AUDIT_LIMIT
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB * 10**6
ROUTED = "routed_uploads"  # session state: the (run, router, upload id) already routed
LAST = "last_routed"  # session state: the decision shown under the inputs (see to_show())
THUMBNAIL = 160  # pixels: the scan's picture stays small beside the answer
NOT_RELIED_ON = "Not to be relied on"


def to_show(run: Run, entry: dict[str, Any], picture: Any, fed: Any) -> dict[str, Any]:
    """What the page keeps to show under its inputs (session state holds plain data, as page
    scripts are re-run): the decision, the scan's picture, and the distance above which the
    federation abstains (None without an abstention model)."""
    return {
        "run": str(run.path),
        "entry": entry,
        "picture": picture,
        "threshold": abstention_threshold(fed),
    }


def abstention_threshold(fed: Any) -> float | None:
    abstention = getattr(fed, "abstention", None)
    return None if abstention is None else float(abstention.threshold)


def route_upload(run: Run, fed: Any, router: Any, upload: Any) -> dict[str, Any] | None:
    """Route an uploaded file once per run and router; None when it was routed before (a rerun
    of the page must not log the same decision again)."""
    done = st.session_state.setdefault(ROUTED, set())
    key = (str(run.path), router.name, upload.file_id)
    if key in done:
        return None
    name = Path(upload.name).name or "upload"
    size = len(upload.getvalue())
    if size > MAX_UPLOAD_BYTES:
        done.add(key)
        return refused(
            run,
            name,
            f"{name}: {human_bytes(size)} is more than the {human_bytes(MAX_UPLOAD_BYTES)} this "
            "page accepts; route it with 'medfed route' instead",
        )
    with tempfile.TemporaryDirectory(prefix="medfed-upload-") as folder:
        path = Path(folder) / name
        path.write_bytes(upload.getvalue())
        result = route_files(fed, router, [path], run.path, names=[name])[0]
        picture = thumbnails.scan_picture(path)
        if result.entry.status != "error":  # kept for the Review page: an upload is read there
            keep_scan(run.path, path, result.entry.sha256, name)
    done.add(key)
    # (route_files names the upload by ``name`` in the answer and the log, not its temporary copy)
    return to_show(run, result.to_dict(), picture, fed)


def refused(run: Run, name: str, reason: str) -> dict[str, Any]:
    """A scan the page would not read, shown as an error (nothing is routed or logged)."""
    entry = {"file": name, "status": "error", "reason": reason}
    return {"run": str(run.path), "entry": entry, "picture": None, "threshold": None}


def readable_path(text: str, folders: list[Path]) -> Path:
    """The scan at ``text``, resolved (symlinks and '..' followed); ConfigError unless it lies
    under one of ``folders`` (the folders the dashboard was started with), and so does every
    file of a series folder."""
    given = Path(text.strip()).expanduser()
    try:
        path = given.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise ConfigError(f"{given}: cannot follow this path (a symlink loop?)") from None
    allowed = [f.resolve() for f in folders]

    def inside(p: Path) -> bool:
        return any(p.is_relative_to(f) for f in allowed)

    shown = ", ".join(str(f) for f in allowed) or "none"
    outside = ConfigError(
        f"{given}: outside the folders this dashboard reads ({shown}); the page reads scans "
        "only there. Upload the scan instead, or start the dashboard with its folder as well: "
        "medfed dashboard RUN SCANS_FOLDER"
    )
    if not inside(path):  # checked first: the page says nothing of what lies outside
        raise outside
    if not path.exists():
        raise ConfigError(f"{given}: no such file or folder")
    if path.is_dir():
        try:
            members = [p.resolve() for p in path.iterdir()]
        except OSError as exc:
            raise ConfigError(f"{given}: cannot list the folder ({exc})") from None
        if not all(inside(p) for p in members):
            raise outside
    return path


def route_path(run: Run, fed: Any, router: Any, text: str) -> dict[str, Any]:
    try:
        path = readable_path(text, common.roots())
    except MedfedError as exc:
        return refused(run, text.strip(), str(exc))
    entry = route_files(fed, router, [path], run.path)[0].to_dict()
    picture = thumbnails.scan_picture(path) if entry["status"] != "error" else None
    return to_show(run, entry, picture, fed)


def distance_text(entry: dict[str, Any], threshold: float | None) -> tuple[str, str]:
    """The scan's distance to the closest site, and its threshold, as the metric shows them."""
    limit = (
        "threshold n/a (trained without abstention)"
        if threshold is None
        else f"threshold {threshold:.2f}: abstains above"
    )
    return fmt(entry.get("ood_score"), 2), limit


def show_result(result: dict[str, Any]) -> None:
    entry, picture = result["entry"], result["picture"]
    st.subheader(f"Result: {entry['file']}")
    status = entry["status"]
    if status == "error":
        st.error(f"Could not route this scan: {common.escape(str(entry['reason']))}")
        return
    picture_column, answer = st.columns([1, 4])
    with picture_column:
        if picture is not None:
            st.image(picture, width=THUMBNAIL, caption=thumbnail_caption(picture))
        else:
            st.caption("No picture of this scan.")
    with answer:
        if status == "routed":
            st.success(f"Routed to site {entry['chosen_site']}")
        else:
            st.warning(f"abstain: {entry['reason']}")
        cols = st.columns(3)
        cols[0].metric("Chosen site", entry["chosen_site"] or "abstain")
        if status == "routed" and entry.get("prediction") is not None:
            cols[1].metric(
                "Prediction",
                entry["prediction"],
                f"probability {fmt(entry['prediction_prob'], 2)}",
                delta_color="off",
                delta_arrow="off",
            )
        distance, limit = distance_text(entry, result["threshold"])
        cols[2].metric(
            "Distance to the closest site", distance, limit, delta_color="off", delta_arrow="off"
        )
    if status == "abstained":
        not_relied_on(entry)
    elif entry.get("site_probs"):
        st.markdown("**Site probabilities**")
        probs = rundata.probabilities_frame(entry["site_probs"], entry["chosen_site"])
        st.plotly_chart(charts.site_probability_bars(probs), key="site_probs")
        st.table(probs.set_index("site"))


def thumbnail_caption(picture: np.ndarray) -> str:
    return "the scan" if picture.ndim == 3 else "the scan (middle slice)"


# the folded-away section of an abstained scan's model outputs (a page script shows any bare
# string, so this says it in a comment)
HYPOTHETICAL = f"{NOT_RELIED_ON}: what the models would have answered (no site fits this scan)"


def not_relied_on(entry: dict[str, Any]) -> None:
    """An abstained scan's model outputs, folded away and marked: no site's model fits it, so
    they are no answer."""
    nearest = entry.get("nearest") or {}
    if not nearest.get("prediction") and not entry.get("site_probs"):
        return
    with st.expander(HYPOTHETICAL, expanded=False):
        st.caption(
            "No site's model fits this scan, so what follows is shown for completeness only: it "
            "is not a prediction and should not be relied on."
        )
        if nearest.get("prediction"):
            st.caption(
                f"Not an answer: the nearest site ({nearest.get('site')}) would have said "
                f"{nearest['prediction']} (probability {fmt(nearest.get('prediction_prob'), 2)})."
            )
        if entry.get("site_probs"):
            probs = rundata.probabilities_frame(entry["site_probs"], None)
            st.plotly_chart(charts.site_probability_bars(probs, relied_on=False), key="site_probs")
            st.table(probs.drop(columns="chosen").set_index("site"))


def audit_section(run: Run) -> None:
    st.subheader("Audit log")
    entries = checks.read_audit(run.path, AUDIT_LIMIT)
    if not entries:
        st.info(f"No scan has been routed with {run.label} yet ({run.path / 'audit.sqlite'}).")
        return
    frame = rundata.audit_frame(entries)
    cols = st.columns(4)
    statuses = cols[0].multiselect("Status", sorted(frame["status"].unique()), key="audit_status")
    sites = cols[1].multiselect(
        "Chosen site", sorted(s for s in frame["chosen_site"].unique() if s), key="audit_site"
    )
    routers = cols[2].multiselect("Router", sorted(frame["router"].unique()), key="audit_router")
    text = cols[3].text_input("File name contains", key="audit_text")
    shown = rundata.filter_audit(frame, statuses=statuses, sites=sites, routers=routers, text=text)
    st.caption(f"{len(shown)} of {len(frame)} routed scans (newest first).")
    st.dataframe(
        with_pacs_ids(rundata.audit_table(shown), run.path),
        hide_index=True,
        width="stretch",
        key="audit_table",
        column_config={
            "file": st.column_config.TextColumn("file", width="medium"),
            "reason": st.column_config.TextColumn("reason", width="large"),
            "probability": st.column_config.NumberColumn("probability", format="%.2f"),
            "distance to closest site": st.column_config.NumberColumn(
                "distance to closest site", format="%.2f"
            ),
        },
    )
    st.download_button(
        "Download these rows (CSV)",
        shown.to_csv(index=False),
        file_name=f"{run.path.name}_audit.csv",
        mime="text/csv",
        key="audit_csv",
    )


def posterior_section(run: Run) -> None:
    """How far the site probabilities can be trusted: the routing posterior's calibration on
    the run's pooled test scans (nothing for a run without it)."""
    summary = common.read_summary(run)
    if summary is None:
        return
    table = clinical.routing_posterior_frame(summary)
    if table.empty:
        return
    st.subheader("How far the site probabilities can be trusted")
    st.caption(
        "The routing posterior P(site | scan) on the run's test scans pooled (origin unknown): "
        "of the scans routed with probability p, a fraction p should reach their own site. "
        "ECE: the mean gap between the two; the temperature was fitted on the sites' "
        "validation scans when the model was published."
    )
    st.dataframe(table, hide_index=True, width="stretch")
    bins = clinical.routing_reliability_frame(summary)
    if not bins.empty:
        title = "Routing: P(chosen site) against how often it was right"
        st.plotly_chart(charts.reliability_diagram(bins, title), key="routing_reliability")


def main() -> None:
    common.heading(
        "Routing",
        "Send a new patient's scan to the site whose model fits it best, or abstain when none "
        "does. Every decision is recorded in the run's audit log (audit.sqlite) before it is "
        "shown; the log keeps a hash of the file, never the image.",
    )
    runs = common.chosen_runs()
    run = common.pick_run(runs, key="routing_run", default=common.routing_run(runs))
    others = ", ".join(r.label for r in runs if r != run)
    pick_other = f" Pick another run above ({others})." if others else ""
    if not run.has_model:
        missing = run.dir.model_dir / "model.json"
        if run.has_summary:  # finished, so the model folder was lost or cut short
            st.warning(
                common.escape(
                    f"Run {run.label}: {missing} is missing though the run finished: its "
                    "model folder is incomplete; retrain the run or restore the folder."
                )
                + pick_other
            )
        else:
            st.info(
                common.escape(f"{run.label} has no trained model yet ({missing} is missing): ")
                + common.status_line(run)
                + pick_other
            )
        return
    try:
        fed = common.load_federation(run)
    except MedfedError as exc:
        st.warning(
            f"Run **{common.escape(run.label)}** cannot route: {common.escape(str(exc))}."
            + pick_other
        )
        return
    names = ["auto", *(r.name for r in routers_for(fed))]
    name = st.selectbox("Router", names, key="router")
    router = make_router(name, fed)
    st.caption(
        f"{fed.algorithm}, {len(fed.sites)} sites, {fed.modality} scans; auto uses "
        f"{default_router(fed).name}."
    )
    upload = st.file_uploader(
        "Upload a scan",
        type=UPLOAD_TYPES,
        key="scan_upload",
        help="A JPEG/PNG/TIFF fundus photo, a DICOM file, or a NIfTI volume (.nii, .nii.gz), "
        f"at most {MAX_UPLOAD_MB} MB.",
    )
    text = st.text_input(
        "... or the path of a scan under the folders this dashboard reads (a DICOM series "
        "folder works too)",
        key="scan_path",
    )
    if upload is not None and (routed := route_upload(run, fed, router, upload)) is not None:
        st.session_state[LAST] = routed
    if st.button("Route this path", key="route_path"):
        if text.strip():
            st.session_state[LAST] = route_path(run, fed, router, text)
        else:
            st.warning("Type the path of a scan first.")
    last = st.session_state.get(LAST)
    if isinstance(last, dict) and last.get("run") == str(run.path):
        show_result(last)
    audit_section(run)
    posterior_section(run)


common.guarded(main)
