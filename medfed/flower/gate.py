"""The site's gate on its SuperNode: every message checked against the site's policy before any
of its data is read, and written, with the reply, to the site's audit log.

A SuperNode whose ``--node-config`` names ``policy="/path/policy.toml"`` takes part only in
runs its policy allows: the run's first message (``query.describe``) carries the run's plan
(:mod:`medfed.governance.plan`), every later one the run's settings with the same plan; the
gate checks the plan (and that the settings are the plan's) before the message reaches the
code that loads the site's scans, and answers a refusal with the rule it breaks. Every message
received and every reply sent is a line of ``STATE_DIR/audit.jsonl`` (kind, run, round, size,
sha256, the decision), with or without a policy. Nothing here imports PyTorch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from medfed.core.errors import MedfedError
from medfed.core.manifest import read_toml
from medfed.governance.checks import Refusal, check_plan
from medfed.governance.plan import Plan
from medfed.governance.policy import load_policy
from medfed.governance.records import APPROVALS, approval_of, approved_plans, log_message
from medfed.governance.statistics import check_statistics_plan, is_statistics_plan

ACCEPTED, REFUSED, UNCHECKED = "accepted", "refused", "unchecked"
PLAN_RECORD = "plan"  # the describe message's plan
REFUSAL_RECORD = "refusal"  # a refusal's site, rule and reason


class PolicyRefused(MedfedError):
    """The site's policy refuses the run (the rule is named)."""

    exit_code = 1


def state_dir(node_config: dict[str, Any]) -> Path:
    """The node's state folder (its checkpoints, approvals and audit log)."""
    value = node_config.get("state-dir")
    return Path(str(value) if value else os.path.expanduser("~/.medfed/node"))


def site_id(node_config: dict[str, Any]) -> str:
    """The site's id, read from its manifest's TOML only (no data is touched)."""
    path = Path(str(node_config.get("manifest") or ""))
    if not path.is_file():
        return "?"
    value = read_toml(path, MedfedError, "the manifest").get("id")
    return str(value) if value else "?"


def _json(content: RecordDict, name: str) -> Any:
    record = content.config_records.get(name)
    return None if record is None else json.loads(str(record["json"]))


def digest(content: RecordDict) -> tuple[int, str]:
    """A message's size (its arrays' bytes and its records' text) and one sha256 over both."""
    sha, size = hashlib.sha256(), 0
    for name in sorted(content.array_records):
        for key, array in content.array_records[name].items():
            sha.update(f"{name}.{key}".encode())
            sha.update(array.data)
            size += len(array.data)
    for name in sorted(content.config_records):
        text = json.dumps(dict(content.config_records[name]), sort_keys=True, default=repr)
        sha.update(name.encode())
        sha.update(text.encode())
        size += len(text)
    return size, sha.hexdigest()


def refusals(content: RecordDict, node_config: dict[str, Any]) -> tuple[str, list[Refusal]]:
    """The policy's decision on a message: ``unchecked`` (no policy, or a message that carries
    no run, such as SecAgg+'s key exchange), else ``accepted`` or ``refused`` with its rules."""
    policy_path = node_config.get("policy")
    run = _json(content, "run")
    plan_json = _json(content, PLAN_RECORD) if run is None else run.get("plan")
    if not policy_path or (run is None and PLAN_RECORD not in content.config_records):
        return UNCHECKED, []
    try:
        policy = load_policy(str(policy_path))
        if plan_json is None:
            return REFUSED, [
                Refusal("plan", "the server sent no run plan; this site takes part only in "
                        "runs whose plan it can check (a medfed server of the same version)")
            ]  # fmt: skip
        plan = Plan.from_json(plan_json)
        approved = approved_plans(state_dir(node_config))
    except MedfedError as exc:
        return REFUSED, [Refusal("policy", str(exc))]
    if is_statistics_plan(plan):  # a statistics-only run: no training rules to apply
        found = check_statistics_plan(policy, plan, site=site_id(node_config), approved=approved)
        if run is not None:  # an approved statistics plan never covers a training message
            found.append(Refusal("plan", "a statistics-only plan cannot carry training messages"))
        return (REFUSED if found else ACCEPTED), found
    backbone = run.get("spec", {}).get("backbone") if run is not None else None
    found = check_plan(
        policy, plan, site=site_id(node_config), approved=approved, backbone=backbone
    )
    if run is not None:
        found += _same_as_plan(run, plan)
    return (REFUSED if found else ACCEPTED), found


def _same_as_plan(run: dict[str, Any], plan: Plan) -> list[Refusal]:
    """A later message's settings must be the plan's (the learning rate may be the one the
    sites' modality set, where the plan leaves it out)."""
    train = run.get("train") if isinstance(run.get("train"), dict) else {}
    differ = sorted(
        k for k in set(train) | set(plan.train)
        if train.get(k) != plan.train.get(k) and not (k == "lr" and k not in plan.train)
    )  # fmt: skip
    if run.get("name") != plan.run_name:
        differ.insert(0, "run name")
    if not differ:
        return []
    return [Refusal("plan", f"this message's settings differ from the plan's: {', '.join(differ)}")]


def check_run(content: RecordDict, node_config: dict[str, Any]) -> None:
    """Raise :class:`PolicyRefused` (naming the first rule) when the policy refuses the run."""
    decision, found = refusals(content, node_config)
    if decision == REFUSED:
        raise PolicyRefused(found[0].text())


def _where(content: RecordDict) -> dict[str, Any]:
    run = _json(content, "run") or {}
    step = _json(content, "step") or {}
    plan = _json(content, PLAN_RECORD) or {}
    return {"run": run.get("name") or plan.get("run_name"), "round": step.get("round")}


def refusal_reply(message: Message, site: str, found: list[Refusal]) -> Message:
    first = found[0]
    content = RecordDict(
        {
            REFUSAL_RECORD: ConfigRecord(
                {"json": json.dumps({"site": site, "refusals": [r.to_json() for r in found]})}
            ),
            "failure": ConfigRecord({"reason": f"site {site}: {first.text()}"}),
        }
    )
    return Message(content, reply_to=message)


def governance(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The ClientApp mod: decide, log, then answer (or refuse without going further)."""
    config = dict(context.node_config)
    folder = state_dir(config)
    kind = message.metadata.message_type
    where = _where(message.content)
    size, sha = digest(message.content)
    decision, found = refusals(message.content, config)
    first = found[0] if found else None
    log_message(
        folder, direction="received", kind=kind, bytes=size, sha256=sha, decision=decision,
        rule=first.rule if first else None, reason=first.reason if first else None, **where,
    )  # fmt: skip
    if decision == REFUSED:
        reply = refusal_reply(message, site_id(config), found)
    else:
        if decision == ACCEPTED and kind.endswith(("describe", "statistics")):
            _note_approval(folder, config, message.content, kind, where)
        try:
            reply = call_next(message, context)
        except Exception as exc:  # the audit log says so, then Flower answers with the error
            log_message(
                folder, direction="sent", kind=kind, decision=decision,
                reason=f"raised {type(exc).__name__}: {exc}", **where,
            )  # fmt: skip
            raise
    size, sha = digest(reply.content) if reply.has_content() else (0, "")
    log_message(
        folder, direction="sent", kind=kind, bytes=size, sha256=sha, decision=decision, **where
    )
    return reply


def _note_approval(
    folder: Path, config: dict[str, Any], content: RecordDict, kind: str, where: dict[str, Any]
) -> None:
    """The audit log names what a run was accepted under, once, as it starts: the operator's
    approval, the policy's list, or a policy that asks for none."""
    plan = Plan.from_json(_json(content, PLAN_RECORD))
    approval = approval_of(folder, plan.sha256)
    if approval is not None:
        why = f"approved by {approval['approved_by']} ({APPROVALS})"
    elif plan.sha256 in load_policy(str(config["policy"])).approved_plans:
        why = "listed in the policy's [approval] plans"
    else:
        why = "the policy asks for no approval"
    log_message(
        folder, direction="decision", kind=kind, sha256=plan.sha256, decision=ACCEPTED,
        rule="approval.required", reason=f"plan {plan.sha256}: {why}", **where,
    )  # fmt: skip
