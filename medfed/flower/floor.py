"""A minimal Flower app pair: the deployed round's floor on Flower 1.42, with no training.

Its ServerApp sends every node, each round, one message of ``down-bytes`` bytes (as medfed's
validation message carries the global weights, with the next round's training) and each node's
ClientApp answers with ``up-bytes`` bytes (as a site's update comes back): the same kinds,
sizes and number of exchanges as a medfed round, with no model, data, checks, checkpoints or
audit log. What a round takes here is what Flower itself takes to carry it; ``medfed
bench-deploy`` sets it against medfed's deployed round. The ServerApp polls for replies every
``POLL_S`` (as medfed's does; ``Grid.send_and_receive`` would poll every 3 s).

Run config: ``nodes`` (how many to wait for), ``rounds``, ``down-bytes``, ``up-bytes``,
``out`` (a JSON file for each round's seconds; ``out`` with the suffix ``.started`` is written
when the nodes are found and the exchanges begin), ``wait-s``, ``reply-timeout-s``. Its ClientApp
imports Flower and numpy only, as medfed's does with a resident worker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

POLL_S = 0.2
"""Seconds between the ServerApp's looks for replies (medfed's Messenger polls as often)."""
KIND = f"{MessageType.EVALUATE}.validate"

server = ServerApp()
client = ClientApp()


def _bytes(n: int, seed: int) -> ArrayRecord:
    """``n`` bytes as one array (medfed sends each whole state as one array, too)."""
    data = np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)
    return ArrayRecord({"payload": Array(data)})


def _size(content: RecordDict) -> int:
    return int(content.array_records["payload"]["payload"].numpy().nbytes)


@client.evaluate("validate")
def answer(message: Message, context: Context) -> Message:
    """The node's reply: as many bytes as the message asks for."""
    up = int(message.content.config_records["step"]["up-bytes"])
    content = RecordDict(
        {"payload": _bytes(up, int(message.content.config_records["step"]["round"]))}
    )
    return Message(content, reply_to=message)


def _nodes(grid: Grid, n: int, wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes[:n]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} of {n} nodes connected within {wait_s:g} s")
        time.sleep(0.5)


def exchange(
    grid: Grid, nodes: list[int], round_: int, down: int, up: int, timeout: float
) -> float:
    """One round: every node's message out, every reply in and checked; its seconds."""
    start = time.perf_counter()
    payload = _bytes(down, round_)
    step = ConfigRecord({"round": round_, "up-bytes": up})
    messages = [
        Message(RecordDict({"payload": payload, "step": step}), dst_node_id=n, message_type=KIND)
        for n in nodes
    ]
    pending = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"round {round_}: {len(pending)} node(s) did not answer")
        for reply in grid.pull_messages(list(pending)):
            if reply.has_error():
                raise RuntimeError(f"round {round_}: {reply.error.reason}")
            if _size(reply.content) != up:
                raise RuntimeError(f"round {round_}: a reply of {_size(reply.content)} bytes")
            pending.discard(reply.metadata.reply_to_message_id)
        if pending:
            time.sleep(POLL_S)
    return time.perf_counter() - start


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    nodes = _nodes(grid, int(config["nodes"]), float(config["wait-s"]))
    down, up, timeout = (
        int(config["down-bytes"]),
        int(config["up-bytes"]),
        float(config["reply-timeout-s"]),
    )
    out = Path(str(config["out"]))
    out.with_suffix(".started").write_text("", encoding="utf-8")  # the exchanges begin
    seconds = [exchange(grid, nodes, r, down, up, timeout) for r in range(int(config["rounds"]))]
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rounds_s": seconds, "nodes": len(nodes)}), encoding="utf-8")
    tmp.replace(out)  # whole or not at all: the bench waits for this file


def write_floor_app(
    folder: Path,
    *,
    nodes: int,
    rounds: int,
    down_bytes: int,
    up_bytes: int,
    out: Path,
    wait_s: float = 600.0,
    reply_timeout_s: float = 600.0,
) -> Path:
    """The Flower app folder of a floor run; its pyproject.toml."""
    from medfed.flower.deploy import write_pyproject  # the bench's side: never a ClientApp's

    return write_pyproject(
        folder,
        "Flower's floor under a medfed round: the same messages, no work",
        {
            "nodes": nodes,
            "rounds": rounds,
            "down-bytes": down_bytes,
            "up-bytes": up_bytes,
            "out": str(out),
            "wait-s": float(wait_s),
            "reply-timeout-s": float(reply_timeout_s),
        },
        name="medfed-floor",
        components=("medfed.flower.floor:server", "medfed.flower.floor:client"),
        source="medfed_floor.py",
    )
