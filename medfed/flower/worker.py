"""A resident site worker: one long-lived process beside a SuperNode that answers the ClientApp's
messages, so PyTorch is imported and the site's scans are loaded once, not once per message.

Flower 1.42 runs every message as a task of its own: the SuperNode starts a fresh
``flwr-clientapp`` process with the task's token, and the process exits after one reply (none of
its isolation modes keeps it). medfed's ClientApp then pays for importing PyTorch and reading the
site on every training and evaluation message. With a worker, the hospital starts, beside its
SuperNode and under the same account::

    medfed deploy worker /var/lib/medfed/worker.sock

and adds ``worker="/var/lib/medfed/worker.sock"`` to the SuperNode's ``--node-config``. The
ClientApp (still one process per message, now without PyTorch) hands each message's content and
context to the worker over that Unix socket and answers with the worker's reply. SecAgg+'s key
exchanges stay in the ClientApp: only the training step reaches the worker.

The socket is created readable and writable by its owner only; what crosses it is Flower's own
protobuf encoding of the message content and context (never pickle). A worker that is not
running is an error of the message, naming the socket and how to start it, never a silent
fallback.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import stat
import struct
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from medfed.core.errors import ConfigError, MedfedError

KINDS = ("query_describe", "train", "secure_train", "validate", "finish", "calibrate", "test")
"""The work a worker does: the functions of :mod:`medfed.flower.client_work` by name."""
_LENGTH = struct.Struct(">Q")
MAX_FRAME = 8 << 30  # a frame longer than 8 GiB is a broken peer, not a model


class WorkerError(MedfedError):
    """The site's worker could not be reached, or could not do the work."""


def _send(sock: socket.socket, *parts: bytes) -> None:
    for part in parts:
        sock.sendall(_LENGTH.pack(len(part)) + part)


def _receive(sock: socket.socket, count: int) -> list[bytes]:
    def exactly(n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError("the other side closed the connection mid-message")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    parts = []
    for _ in range(count):
        (size,) = _LENGTH.unpack(exactly(_LENGTH.size))
        if size > MAX_FRAME:
            raise ConnectionError(f"a frame of {size} bytes is more than this protocol carries")
        parts.append(exactly(size))
    return parts


def ask(path: str, kind: str, content: RecordDict, context: Context) -> RecordDict:
    """Have the worker at ``path`` do ``kind`` with the message's content; its reply content.
    The worker's changes to the context's state come back into ``context``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise WorkerError(
                f"this SuperNode's worker at {path} does not answer ({exc.strerror or exc}); "
                f"start it with 'medfed deploy worker {path}' under the SuperNode's account, "
                "or take worker= out of the SuperNode's --node-config"
            ) from None
        _send(
            sock,
            kind.encode(),
            context_to_proto(context).SerializeToString(),
            recorddict_to_proto(content).SerializeToString(),
        )
        status, state, reply = _receive(sock, 3)
    except ConnectionError as exc:
        raise WorkerError(f"this SuperNode's worker at {path} broke off: {exc}") from None
    finally:
        sock.close()
    answer = json.loads(status)
    if not answer.get("ok"):
        raise WorkerError(str(answer.get("error") or "the worker failed without a reason"))
    context.state = recorddict_from_proto(ProtoRecordDict.FromString(state))
    return recorddict_from_proto(ProtoRecordDict.FromString(reply))


def answer(kind: str, context: Context, content: RecordDict) -> tuple[dict[str, Any], RecordDict]:
    """Do one piece of work as the ClientApp would: its status and reply content."""
    from medfed.flower import client_work

    if kind not in KINDS:
        return {"ok": False, "error": f"unknown work {kind!r}"}, RecordDict()
    try:
        return {"ok": True}, getattr(client_work, kind)(content, context)
    except Exception as exc:  # the ClientApp raises it, for Flower to report
        return {"ok": False, "error": client_work.failure_reason(exc)}, RecordDict()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            kind, context_bytes, content_bytes = _receive(self.request, 3)
            context = context_from_proto(ProtoContext.FromString(context_bytes))
            content = recorddict_from_proto(ProtoRecordDict.FromString(content_bytes))
        except Exception as exc:  # a broken or foreign peer: answered, and the worker goes on
            status, context, content = {"ok": False, "error": f"bad request: {exc}"}, None, None
        else:
            status, content = answer(kind.decode(errors="replace"), context, content)
        state = context.state if context is not None else RecordDict()
        with contextlib.suppress(OSError):
            _send(
                self.request,
                json.dumps(status).encode(),
                recorddict_to_proto(state).SerializeToString(),
                recorddict_to_proto(content or RecordDict()).SerializeToString(),
            )


class WorkerServer(socketserver.UnixStreamServer):
    """The worker: one message at a time, on a socket only its owner may open."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        check_socket_path(self.path)
        with contextlib.suppress(FileNotFoundError):
            # a socket a stopped worker of this account left (check_socket_path saw that no
            # one listens on it and that it is this account's)
            self.path.unlink()
        old = os.umask(0o177)
        try:
            super().__init__(str(self.path), _Handler)
        finally:
            os.umask(old)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def check_socket_path(path: Path) -> None:
    """Refuse a socket path the worker must not take: an existing file that is not a socket, a
    missing folder, a folder others may write to (they could swap the socket), or a path too
    long for a Unix socket."""
    where = f"worker socket {path}"
    if len(os.fsencode(str(path))) > 100:
        raise ConfigError(
            f"{where}: a Unix socket path must be at most 100 bytes; use a shorter one"
        )
    if os.path.lexists(path) and not stat.S_ISSOCK(path.lstat().st_mode):
        raise ConfigError(f"{where}: exists and is not a socket; choose another path")
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(_missing_folder(where, folder))
    # Even a sticky folder (/tmp) lets another account take the socket's name first, and the
    # SuperNode would then hand its messages to that account's process.
    if folder.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{where}: others may write to {folder}, so they could replace the socket or take "
            "its name first; put it in a folder only the SuperNode's account can write to"
        )
    if os.path.lexists(path):
        _check_left_socket(path, where)


def _missing_folder(where: str, folder: Path) -> str:
    """Why ``folder`` is no folder: a part of its path is a file, or it is not there yet."""
    for part in (folder, *folder.parents):
        if os.path.lexists(part) and not part.is_dir():
            return (
                f"{where}: {part} is a file, not a folder, so the socket cannot go under it; "
                "choose a socket path inside a folder"
            )
    return f"{where}: the folder {folder} does not exist; make it first"


def _check_left_socket(path: Path, where: str) -> None:
    """An existing socket is taken over only when it is this account's and nothing listens on
    it (a stopped worker's): a running worker keeps its socket, another account's is refused."""
    if path.lstat().st_uid != os.getuid():
        raise ConfigError(
            f"{where}: an existing socket of another account; remove it (as that account) or "
            "choose another path"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return  # nobody listens: a stopped worker's socket, safe to replace
    raise ConfigError(
        f"{where}: another process is listening on it (a worker already running?); stop it "
        "first, or give this worker another path"
    )
