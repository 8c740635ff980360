"""The ClientApp: one hospital's side of a deployed run, on its SuperNode.

Each message's content is answered by :mod:`medfed.flower.client_work`: in this process,
imported on the first message that needs it, or by the site's resident worker
(:mod:`medfed.flower.worker`) when the SuperNode's ``--node-config`` names one with ``worker``.
A SuperNode starts a fresh ClientApp process per message, and SecAgg+'s key exchanges
(:mod:`medfed.flower.secure`) need no model, so they do not pay for importing PyTorch.
"""

from __future__ import annotations

import functools

from flwr.app import Context, Message, MessageType
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from medfed.flower.gate import governance
from medfed.flower.masks import install

install()  # SecAgg+'s masks from the whole shared key, as the server expands them


def secure_aggregation(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """SecAgg+ for the training messages that carry it; every other message passes by."""
    secure = (
        message.metadata.message_type == MessageType.TRAIN
        and RECORD_KEY_CONFIGS in message.content.config_records
    )
    return secaggplus_mod(message, context, call_next) if secure else call_next(message, context)


# The site's gate first: a refused run's message reaches nothing else (SecAgg+ included).
app = ClientApp(mods=[governance, secure_aggregation])


def _answer(kind: str, message: Message, context: Context) -> Message:
    """The reply to ``message``: ``client_work.<kind>`` of its content, done here or by the
    site's worker."""
    worker = context.node_config.get("worker")
    if worker:
        from medfed.flower.worker import ask

        content = ask(str(worker), kind, message.content, context)
    else:
        from medfed.flower import client_work

        content = getattr(client_work, kind)(message.content, context)
    return Message(content, reply_to=message)


@app.query("describe")
def query_describe(message: Message, context: Context) -> Message:
    return _answer("query_describe", message, context)


@app.query("statistics")
def query_statistics(message: Message, context: Context) -> Message:
    """A statistics-only run: the site's data card statistics, suppressed and noised."""
    from medfed.flower.statistics import site_statistics

    return Message(site_statistics(message.content, context), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    secure = RECORD_KEY_CONFIGS in message.content.config_records
    return _answer("secure_train" if secure else "train", message, context)


# The evaluate messages a site answers; each builds (or reuses) the site's model the same way.
for _kind in ("validate", "finish", "calibrate", "test"):
    app.evaluate(_kind)(functools.partial(_answer, _kind))
