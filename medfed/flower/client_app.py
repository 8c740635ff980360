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
from medfed.algorithms.privacy import BudgetSpent
from medfed.data.records import Split
from medfed.federation import wire
from medfed.federation.site import SiteWorker, failure_reason
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
from medfed.serving.bundle import TrainedFederation
from medfed.serving.evaluation import site_evaluation

app = ClientApp()


def _answer(message: Message, work: Callable[[], RecordDict]) -> Message:
    try:
        content = work()
    except Exception as exc:  # the server records the reason against this site
        content = RecordDict({"failure": ConfigRecord({"reason": failure_reason(exc)})})
    return Message(content=content, reply_to=message)


def _node(message: Message, context: Context) -> SiteNode:
    """This site in the message's run; the starting weights, when they come along, are
    checked against the run's hash and kept."""
    init = state_of(message.content, "init") if "init" in message.content.array_records else None
    return SiteNode(
        dict(context.node_config), RunSettings.from_json(json_of(message.content, "run")), init
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
        try:
            done = worker.train_round(
                round_,
                float(step["lr"]),
                payload_of(message.content),
                list(step["keys"]),
                dtypes,
                step.get("fault"),
            )
        except BudgetSpent:
            node.save(round_, worker)  # the site remembers that its privacy budget stopped it
            raise
        worker.keep(done)
        node.save(round_, worker)
        return RecordDict(
            {
                "payload": payload_record(done.payload_up),
                "result": json_record(
                    {
                        "loss": done.result.loss,
                        "metrics": done.result.metrics,
                        "stats": done.result.stats,
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
        published = worker.publish(_global(node, worker, message))
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

    return _answer(message, work)


def _federation(message: Message, node: SiteNode) -> TrainedFederation:
    info = json_of(message.content, "federation")
    return TrainedFederation.from_parts(info, weights_of(message.content), str(node.setup.device))


@app.evaluate("calibrate")
def calibrate(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        scores = _federation(message, node).abstention_scores(node.data.raw[Split.VAL])
        return RecordDict({"scores": ArrayRecord({"scores": Array(np.asarray(scores))})})

    return _answer(message, work)


@app.evaluate("test")
def test(message: Message, context: Context) -> Message:
    def work() -> RecordDict:
        node = _node(message, context)
        fed = _federation(message, node)
        norms = [s.normalization for s in fed.sites]
        part = site_evaluation(fed, node.data, fed.position(node.data.id), norms)
        return RecordDict({"evaluation": json_record(part)})

    return _answer(message, work)
