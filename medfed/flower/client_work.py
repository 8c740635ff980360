"""What the ClientApp does with each message: one hospital's side of a deployed run.

:mod:`medfed.flower.client_app` routes each message's content here (importing this module, and
PyTorch with it, only for messages that need a model), or hands it to the site's resident worker
(:mod:`medfed.flower.worker`), which calls the same functions. Each takes the message's content
and the node's context and returns the reply's content. Message types (``<category>.<action>``),
each answered from the site's own data:

- ``query.describe``: the site's id, label map, input shape and training-set size;
- ``train``: decode the global state (or rebuild it from the one validated last round, when
  the server did not send it again), run the round's local steps, send the update back (under
  secure aggregation: its difference to the global state, scaled, for SecAgg+ to mask);
- ``evaluate.validate``: figures on the validation split after a round (the site keeps the
  global weights it validated);
- ``evaluate.finish``: fine-tune where the algorithm asks, publish the final weights and the
  feature statistics abstention needs;
- ``evaluate.calibrate`` / ``evaluate.test``: with every site's final model, abstention scores
  of the validation scans, then the test figures and router counts (per-scan predictions
  stay in the site's state folder unless the run's plan sends them).

Scans never leave the node; replies hold weights, figures and counts only. A failure is answered
with its reason, so the server can log it against the site.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from medfed.algorithms.base import State
from medfed.algorithms.discriminant import SENT
from medfed.algorithms.privacy import BudgetSpent
from medfed.core.errors import MedfedError
from medfed.data.records import Split
from medfed.federation import wire
from medfed.federation.site import SiteWorker, failure_reason
from medfed.federation.validate import validate_update
from medfed.flower import masks, secure
from medfed.flower.gate import check_run
from medfed.flower.node import RunSettings, SiteNode, describe
from medfed.flower.records import (
    json_of,
    json_record,
    payload_of,
    payload_record,
    state_of,
    state_record,
    weights_of,
)
from medfed.governance.policy import load_policy
from medfed.routing.bundle import TrainedFederation
from medfed.routing.evaluation import site_evaluation, suppress_small
from medfed.routing.posterior import routing_scores
from medfed.runs import RunDir


def _answer(work: Callable[[], RecordDict]) -> RecordDict:
    try:
        return work()
    except Exception as exc:  # the server records the reason against this site
        return RecordDict({"failure": ConfigRecord({"reason": failure_reason(exc)})})


def _node(content: RecordDict, context: Context) -> SiteNode:
    """This site in the message's run; the starting weights, when they come along, are
    checked against the run's hash and kept."""
    check_run(content, dict(context.node_config))  # again here: SecAgg+'s training passes by
    init = state_of(content, "init") if "init" in content.array_records else None
    return SiteNode(dict(context.node_config), RunSettings.from_json(json_of(content, "run")), init)


def _weights(node: SiteNode, content: RecordDict) -> bytes:
    """The message's weights: its payload, or, where the server did not send them again, the
    same bytes rebuilt from the global weights this site validated last round."""
    step = json_of(content, "step")
    reused = step.get("reuse_validated")  # the sha256 of the weights the site already holds
    if reused:
        return node.validated_downlink(list(step["keys"]), str(reused))
    return payload_of(content)


def _global(node: SiteNode, worker: SiteWorker, content: RecordDict) -> State:
    """The whole global state the server sent with an evaluation (float32, lossless)."""
    keys = json_of(content, "step")["keys"]
    received = wire.decode(_weights(node, content), dtypes={k: worker.state[k] for k in keys})
    return {k: v.to(node.setup.device) for k, v in received.items()}


def query_describe(content: RecordDict, context: Context) -> RecordDict:
    return _answer(lambda: RecordDict({"site": json_record(describe(context.node_config))}))


def _train_round(
    context: Context,
    content: RecordDict,
    check: Callable[[SiteNode, State, State], dict[str, Any]] | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """Train one round on the message's global state and keep it; the update's payload and
    its figures. ``check(node, received, sent)``: looks at the update (decoded) before the site
    keeps its round, raises to refuse it, and returns figures to report with it."""
    node = _node(content, context)
    step = json_of(content, "step")
    round_ = int(step["round"])
    start = time.perf_counter()
    worker = node.worker(round_ - 1)
    dtypes = {k: worker.state[k] for k in step["keys"]}
    if step.get("held_sha256"):  # a delta downlink: decode it against the server's reference
        reference = node.held_matching(worker, round_ - 1, step["keys"], str(step["held_sha256"]))
        worker.held.update(reference)
    if step.get("stats_held") is False and float(worker.extra.get(SENT, torch.zeros(1)).sum()):
        worker.extra[SENT] = torch.zeros(1)  # the server never took them: send them again
    payload = _weights(node, content)
    try:
        done = worker.train_round(
            round_, float(step["lr"]), payload, list(step["keys"]), dtypes, step.get("fault")
        )
    except BudgetSpent:
        node.save(round_, worker)  # the site remembers that its privacy budget stopped it
        raise
    more = {}
    if check is not None:
        received = wire.decode(payload, dtypes=dtypes)
        more = check(node, received, wire.decode(done.payload_up, dtypes=dtypes))
    worker.keep(done)
    node.save(round_, worker)
    return done.payload_up, {
        "loss": done.result.loss,
        "metrics": done.result.metrics,
        "stats": done.result.stats,
        "seconds": time.perf_counter() - start,
        **more,
    }


def train(content: RecordDict, context: Context) -> RecordDict:
    def work() -> RecordDict:
        payload, result = _train_round(context, content)
        return RecordDict({"payload": payload_record(payload), "result": json_record(result)})

    return _answer(work)


def secure_train(legacy: RecordDict, context: Context) -> RecordDict:
    """A round under secure aggregation (``secaggplus_mod`` calls this between key sharing and
    unmasking): the site checks its own update, since the server will only see the sum, then
    answers with it as differences to the global state, scaled for SecAgg+ to mask.

    A failure raises (the protocol then counts the site out of this round's sum, and the server
    logs the reason Flower reports)."""
    content = secure.from_fitins(legacy)
    step = json_of(content, "step")
    keys, bound = list(step["keys"]), float(step["secure_bound"])
    if step.get("masks") != masks.installed():
        raise MedfedError(
            f"the server expands SecAgg+'s masks with {step.get('masks') or 'stock'!r}, this "
            f"site with {masks.installed()!r}: the sum would not unmask; run the same medfed "
            "version on the server and every site"
        )
    vectors: list[np.ndarray] = []
    weight: list[int] = []

    def check(node: SiteNode, received: State, sent: State) -> dict[str, Any]:
        validate_update(node.data.id, sent, received)
        n_train = node.data.n(Split.TRAIN)
        most = secure.max_weight(context)
        if n_train > most:
            raise MedfedError(
                f"site {node.data.id!r} has {n_train} training scans, more than the "
                f"{most:g} the server planned this round's secure sum for"
            )
        scaled, clipped = secure.scaled_update(received, sent, keys, bound)
        vectors.extend(scaled)
        weight.append(n_train)
        return {"secure_clipped": clipped}

    _, result = _train_round(context, content, check)
    if result["stats"]:
        raise MedfedError("this algorithm reports statistics, which secure aggregation cannot hide")
    return secure.fitres_content(vectors, weight[0], result)


def validate(content: RecordDict, context: Context) -> RecordDict:
    """Figures after a round; the site keeps the global weights it validated, which later
    messages then need not carry again. A message that also carries the next round's training
    (``next``, with ``next_payload``) has the site train that round right after, as a training
    message would; its answer goes with the figures (``next_payload``, ``next_result``, or
    ``next_failure``)."""

    def work() -> RecordDict:
        node = _node(content, context)
        worker = node.worker(int(json_of(content, "step")["round"]))
        figures = worker.validate(_global(node, worker, content))
        node.keep_validated(payload_of(content))
        return RecordDict({"figures": json_record(figures)})

    reply = _answer(work)
    if "next" in content.config_records and "failure" not in reply.config_records:
        records = content.config_records
        part = RecordDict(
            {
                "run": records["run"],
                "step": records["next"],
                "payload": content.array_records["next_payload"],
            }
        )
        for name, record in train(part, context).items():
            reply[f"next_{name}"] = record
    return reply


def finish(content: RecordDict, context: Context) -> RecordDict:
    def work() -> RecordDict:
        node = _node(content, context)
        worker = node.worker(node.run.config.rounds)
        published = worker.publish(_global(node, worker, content))
        gaussian = published.gaussian
        return RecordDict(
            {
                "weights": state_record(published.state),
                "features": state_record({"mean": gaussian.mean, "precision": gaussian.precision}),
                "site": json_record(
                    {
                        "entry": published.entry.to_dict(),
                        "n_train": published.n_train,
                        "privacy": published.privacy and published.privacy.to_dict(),
                    }
                ),
            }
        )

    return _answer(work)


def _federation(content: RecordDict, node: SiteNode) -> TrainedFederation:
    info = json_of(content, "federation")
    return TrainedFederation.from_parts(info, weights_of(content), str(node.setup.device))


def calibrate(content: RecordDict, context: Context) -> RecordDict:
    def work() -> RecordDict:
        node = _node(content, context)
        fed = _federation(content, node)
        raw = node.data.raw[Split.VAL]
        arrays = {"scores": Array(np.asarray(fed.abstention_scores(raw)))}
        if fed.routes:  # the routing posterior's temperature is fitted on these
            arrays["routing"] = Array(np.ascontiguousarray(routing_scores(fed, raw)))
        return RecordDict({"scores": ArrayRecord(arrays)})

    return _answer(work)


def test(content: RecordDict, context: Context) -> RecordDict:
    """The site's test figures. Its per-scan predictions go to its own state folder
    (``STATE_DIR/RUN/SITE/predictions.csv``) and leave only when the run's plan lists
    ``predictions`` among its outputs (the site's policy allowed that plan); every count cell
    on fewer scans than the policy's ``min_count`` is withheld (:func:`suppress_small`)."""

    def work() -> RecordDict:
        node = _node(content, context)
        fed = _federation(content, node)
        norms = [s.normalization for s in fed.sites]
        part = site_evaluation(
            fed, node.data, fed.position(node.data.id), norms, seed=node.run.config.seed
        )
        rows = part.pop("scans")
        RunDir(node.dir).write_predictions(rows)
        plan = node.run.plan or {}
        if "predictions" in plan.get("outputs", []):
            part["scans"] = rows
        part = suppress_small(part, _min_count(context))
        return RecordDict({"evaluation": json_record(part)})

    return _answer(work)


def _min_count(context: Context) -> int:
    """The site's policy's ``outputs.min_count`` (0 without a policy)."""
    path = context.node_config.get("policy")
    return load_policy(str(path)).min_count if path else 0
