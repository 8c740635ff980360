"""Site audit: the audit log of the SuperNode whose state folder ``medfed dashboard
--state-dir DIR`` was given: every message the site received and sent (run, round, kind, size,
hash) and its policy's decision, refusals highlighted."""

from __future__ import annotations

import streamlit as st

from medfed.dashboard import common, sitelog

ALL = "all runs"


def main() -> None:
    common.heading(
        "Site audit",
        "Every message this site's SuperNode received and sent, with its site policy's decision "
        "(accepted, refused with the rule, or unchecked when no policy applies).",
    )
    folder = sitelog.state_dir()
    if folder is None:
        st.info(
            "No site state folder given. Start the dashboard with `medfed dashboard --state-dir "
            "DIR` (the SuperNode's state-dir) to read its audit log here."
        )
        return
    path = sitelog.audit_path(folder)
    st.caption(f"Reading: {common.escape(str(path))}")
    entries = sitelog.records(folder)  # a damaged line: the page says which (guarded)
    if not entries:
        st.info(
            f"{common.escape(str(path))} holds no message yet: the SuperNode has received none "
            "(or writes its state elsewhere: check its --node-config state-dir)."
        )
        return
    left, right = st.columns(2)
    with left:
        run = st.selectbox("Run", [ALL, *sitelog.runs(entries)], key="audit_run")
    with right:
        shown = st.multiselect(
            "Decision", sitelog.decisions(entries), default=sitelog.decisions(entries),
            key="audit_decision",
        )  # fmt: skip
    frame = sitelog.audit_frame(entries, run=None if run == ALL else run, decision=shown)
    refused = sitelog.refusals(frame)
    st.markdown(f"**{len(frame)} record(s)**; {len(refused)} refused message(s)")
    for _, row in refused.iterrows():
        st.error(
            common.escape(
                f"Refused: {row['kind']} of run {row['run']} at {row['time (UTC)']} UTC, rule "
                f"{row['rule']}: {row['reason']}"
            )
        )
    st.dataframe(sitelog.highlighted(frame), hide_index=True)


common.guarded(main)
