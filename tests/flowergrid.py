"""A Flower grid in one process, for tests of what messages carry.

:class:`InProcessGrid` stands where the SuperLink does for medfed's ServerApp: each message goes
through Flower's own wire format (protobuf) to medfed's real ClientApp, with its mods, called in
this process with the node's own :class:`~flwr.app.Context`, and back. Like a SuperNode, a node
keeps its context's state only when the ClientApp answered without raising, and a raising
ClientApp answers with Flower's error message. Every reply the server received is kept, for
tests to look at what the server saw.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.supercore.task_identity import TaskIdentity

from medfed.config import TrainConfig
from medfed.flower.client_app import app as client_app
from medfed.flower.server_app import Deployment, FlowerRun

SUPERLINK = 1


def _wire(message: Message) -> Message:
    return message_from_proto(message_to_proto(message))


class BaseGrid:
    """What every test grid shares: it stands as the SuperLink (ids stamped on each message as
    the SuperLink stamps them) and keeps each reply until the server pulls it. A grid says
    what a node answers (:meth:`answer`) and may hold a reply back (:meth:`keep`)."""

    def __init__(self, nodes) -> None:
        # What flwr-serverapp sets in its process; Message() reads it.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK, 1
        self.nodes = list(nodes)
        self.replies: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages) -> list[str]:
        ids = []
        for message in messages:
            meta = message.metadata.__dict__
            meta |= {"_message_id": uuid.uuid4().hex, "_src_node_id": SUPERLINK, "_run_id": 1}
            self.keep(message, self.answer(message))
            ids.append(message.metadata.message_id)
        return ids

    def answer(self, message: Message) -> Message:
        raise NotImplementedError

    def keep(self, message: Message, reply: Message) -> None:
        self.replies[message.metadata.message_id] = reply

    def pull_messages(self, message_ids) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))


class InProcessGrid(BaseGrid):
    def __init__(self, node_configs: dict[int, dict[str, str]]) -> None:
        super().__init__(node_configs)
        self.contexts = {
            node: Context(
                run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={}
            )
            for node, config in node_configs.items()
        }
        self.sent: list[Message] = []  # every message the server pushed, in order
        self.received: list[Message] = []  # every reply the server pulled, in order

    def answer(self, message: Message) -> Message:
        self.sent.append(message)
        return self._deliver(_wire(message))

    def _deliver(self, message: Message) -> Message:
        node = message.metadata.dst_node_id
        context = copy.deepcopy(self.contexts[node])
        try:
            reply = client_app(message, context)
        except Exception as exc:  # as flwr-clientapp answers a raising ClientApp
            reason = f"{type(exc)}:<'{exc}'>"
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason)
            return _wire(Message(error, reply_to=message))
        self.contexts[node] = context
        return _wire(reply)

    def pull_messages(self, message_ids) -> list[Message]:
        out = super().pull_messages(message_ids)
        self.received.extend(out)
        return out


def run_in_process(
    root: Path, manifests: dict[str, Path], cache: Path, config: TrainConfig, **options: Any
) -> tuple[Path, InProcessGrid]:
    """A deployed run of ``config`` on the sites of ``manifests`` (in their order), through an
    :class:`InProcessGrid`; its run directory and the grid. ``options``: those of
    :func:`flower_run` (``worker``: the socket of a resident worker every node hands its work
    to)."""
    run = flower_run(root, manifests, cache, config, **options)
    run.run()
    return root / options.get("name", "run"), run.grid


def flower_run(
    root: Path,
    manifests: dict[str, Path],
    cache: Path,
    config: TrainConfig,
    *,
    secure: bool = False,
    secure_bound: float | None = None,
    name: str = "run",
    worker: Path | None = None,
    wait_s: float = 30.0,
    reply_timeout_s: float = 30.0,
    grid: Callable[[dict[int, dict[str, str]]], InProcessGrid] = InProcessGrid,
) -> FlowerRun:
    """The ServerApp's run of :func:`run_in_process`, not started, over ``grid`` made of the
    nodes' configs (their node ids 10, 11, ... in the sites' order); the nodes keep their state
    under ROOT/NAME_nodes."""
    sites = list(manifests)
    configs = {
        10 + i: {
            "manifest": str(manifests[site]),
            "state-dir": str(root / f"{name}_nodes"),
            "cache-dir": str(cache),
        }
        for i, site in enumerate(sites)
    }
    for node_config in configs.values():
        if worker is not None:
            node_config["worker"] = str(worker)
    run_config = {
        "train": tomli_w.dumps({"train": config.to_dict()}),
        "sites": ",".join(sites),
        "run-dir": str(root / name),
        "wait-s": wait_s,
        "reply-timeout-s": reply_timeout_s,
        "secure-aggregation": secure,
    }
    if secure_bound is not None:
        run_config["secure-bound"] = secure_bound
    return FlowerRun(grid(configs), Deployment.from_run_config(run_config))
