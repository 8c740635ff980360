"""The ClientApp: one hospital's side of a deployed run, on its SuperNode.

Message types (``<category>.<action>``), each answered from the site's own data:

- ``query.describe``: the site's id, label map, input shape and training-set size;
- ``train``: decode the global state, run the round's local steps, send the update back;
- ``evaluate.validate``: figures on the validation split after a round;
- ``evaluate.finish``: fine-tune where the algorithm asks, publish the final weights and the
  feature statistics abstention needs;
- ``evaluate.calibrate`` / ``evaluate.test``: with every site's final model, abstention scores
  of the validation scans, then the test figures and router counts.

Scans never leave the node; replies hold weights, figures and counts only. A failure is answered
with its reason, so the server can log it against the site.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from medfed.algorithms.base import State
from medfed.data.records import Split
from medfed.federation import wire
from medfed.federation.site import SiteWorker, failure_reason
from medfed.flower.node import RunSettings, SiteNode, describe
from medfed.flower.records import (
    json_of,
    json_record,
    payload_of,
    payload_record,
    state_record,
    weights_of,
)
from medfed.serving.abstention import site_gaussian
from medfed.serving.bundle import SiteEntry, TrainedFederation
from medfed.serving.evaluation import site_evaluation

app = ClientApp()


def _answer(message: Message, work: Callable[[], RecordDict]) -> Message:
    try:
        content = work()
    except Exception as exc:  # the server records the reason against this site
        content = RecordDict({"failure": ConfigRecord({"reason": failure_reason(exc)})})
    return Message(content=content, reply_to=message)


def _node(message: Message, context: Context) -> SiteNode:
    return SiteNode(
        dict(context.node_config), RunSettings.from_json(json_of(message.content, "run"))
    )


def _global(node: SiteNode, worker: SiteWorker, message: Message) -> State:
    """The whole global state the server sent with an evaluation (float32, lossless)."""
    keys = json_of(message.content, "step")["keys"]
    received = wire.decode(payload_of(message.content), dtypes={k: worker.state[k] for k in keys})
    return {k: v.to(node.setup.device) for k, v in received.items()}


@app.query("describe")
def query_describe(message: Message, context: Context) -> Message:
    return _answer(
        message, lambda: RecordDict({"site": json_record(describe(context.node_config))})
    )


@app.train()
def train(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        step = json_of(message.content, "step")
        round_ = int(step["round"])
        start = time.perf_counter()
        worker = node.worker(round_ - 1)
        dtypes = {k: worker.state[k] for k in step["keys"]}
        done = worker.train_round(
            round_,
            float(step["lr"]),
            payload_of(message.content),
            list(step["keys"]),
            dtypes,
            step.get("fault"),
        )
        worker.keep(done)
        node.save(round_, worker)
        return RecordDict(
            {
                "payload": payload_record(done.payload_up),
                "result": json_record(
                    {
                        "loss": done.result.loss,
                        "metrics": done.result.metrics,
                        "seconds": time.perf_counter() - start,
                    }
                ),
            }
        )

    return _answer(message, work)


@app.evaluate("validate")
def validate(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        worker = node.worker(int(json_of(message.content, "step")["round"]))
        return RecordDict({"figures": json_record(worker.validate(_global(node, worker, message)))})

    return _answer(message, work)


@app.evaluate("finish")
def finish(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        worker = node.worker(node.run.config.rounds)
        state = worker.finish(_global(node, worker, message))
        entry = SiteEntry(
            node.data.id, node.index, 1.0, node.data.normalization, node.data.manifest
        )
        worker.load(state)
        gaussian = site_gaussian(worker.model, node.data.x[Split.TRAIN], node.setup, node.data.id)
        return RecordDict(
            {
                "weights": state_record(state),
                "features": state_record({"mean": gaussian.mean, "precision": gaussian.precision}),
                "site": json_record({"entry": entry.to_dict(), "n_train": worker.n_train}),
            }
        )

    return _answer(message, work)


def _federation(message: Message, node: SiteNode) -> tuple[TrainedFederation, int]:
    info = json_of(message.content, "federation")
    fed = TrainedFederation.from_parts(info, weights_of(message.content), str(node.setup.device))
    position = [s.id for s in fed.sites].index(node.data.id)
    return fed, position


@app.evaluate("calibrate")
def calibrate(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        fed, _ = _federation(message, node)
        raw = node.data.raw[Split.VAL]
        scores = np.zeros(0)
        if len(raw) and fed.abstention is not None:
            views = [s.normalization.apply(raw) for s in fed.sites]
            scores = fed.abstention.scores(fed.outputs(views).features)
        return RecordDict({"scores": ArrayRecord({"scores": Array(np.asarray(scores))})})

    return _answer(message, work)


@app.evaluate("test")
def test(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        fed, position = _federation(message, node)
        norms = [s.normalization for s in fed.sites]
        part = site_evaluation(fed, node.data, position, norms)
        return RecordDict({"evaluation": json_record(part)})

    return _answer(message, work)
