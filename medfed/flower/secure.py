"""Secure aggregation of a deployed run's updates, with Flower's SecAgg+.

The server learns only the weighted sum of the sampled sites' updates; each site's own update
reaches it masked. The protocol is Flower's (``SecAggPlusWorkflow`` on the server, driven round
by round inside medfed's own round loop; ``secaggplus_mod`` on each SuperNode); this module sets
its numbers from what medfed's updates hold, and packs medfed's messages into the legacy
``FitIns``/``FitRes`` form the protocol carries.

How the numbers are set:

- **What a site sends**: the difference between its shared weights after the round and the
  global state it received (float32, lossless), never raw weights or normalization statistics.
  Differences are small, so a fixed range holds them.
- **Range**: each difference of a floating-point tensor is clipped on the site to
  ``+-bound`` (``--secure-bound``, default :data:`DEFAULT_BOUND`) and divided by it; integer
  buffers (BatchNorm's batch count) use :data:`INT_BOUND`. The site counts what it clipped and
  reports the count with its loss (``secure_clipped`` in metrics.jsonl, and an event): nothing is
  clipped silently. SecAgg+'s own clipping range is then 1, which no scaled value exceeds.
- **Weights**: ``max_weight`` is the largest training set among the sampled sites, so every
  site's ``num_examples / max_weight`` is at most 1 and keeps the full resolution.
- **Quantization**: as fine as the 32-bit modulus allows for the number of sites (the masked sum
  of ``n`` values below the quantization range must not wrap): ``2**32 / 2**ceil(log2(n + 1))``,
  at most ``2**30``. For 3 sites and the default bound, one step is ``2 / 2**30 ~ 1.9e-9`` of a
  weight, far below what training moves (:func:`error_bound` gives the worst case).
- **Shares**: every sampled site holds a share of every other's keys; a majority
  (``n // 2 + 1``, at least 2) reconstructs them. Up to ``n - threshold`` sites may drop after
  the key exchange and the round still aggregates the rest; fewer than ``threshold`` sites
  colluding with the server learn nothing about another site's update.

Settings that cannot work are refused before a run starts (:func:`refusal`). The masks are
expanded from the whole shared key by ChaCha20, not from a 32-bit fold of it by numpy's
Mersenne Twister as Flower's own generator does (:mod:`medfed.flower.masks`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat

from medfed.flower import masks

masks.install()  # both ends expand SecAgg+'s masks from the whole key (medfed.flower.masks)

DEFAULT_BOUND = 1.0
"""How far one weight may move in one round before its site clips the difference."""
INT_BOUND = float(2**20)
"""The same for integer buffers (BatchNorm's batch count moves by the local steps)."""
MODULUS = 2**32
"""SecAgg+'s mask modulus (Flower's default and its largest)."""
MAX_QUANTIZATION = 2**30  # Flower quantizes into int32
FITINS = "fitins.config"
"""The record a SecAgg+ training message carries medfed's own message in."""
STAGES = ("setup", "key sharing", "masked update collection", "unmasking")
"""SecAgg+'s four exchanges in one round, in order."""


def quantization_range(n_sites: int) -> int:
    """The finest quantization whose masked sum over ``n_sites`` cannot wrap the modulus."""
    return min(MAX_QUANTIZATION, MODULUS >> math.ceil(math.log2(n_sites + 1)))


def threshold(n_sites: int) -> int:
    """Shares needed to rebuild a site's keys: a majority of the sampled sites, at least 2."""
    return max(2, n_sites // 2 + 1)


def error_bound(weights: list[float], bound: float) -> float:
    """The largest error SecAgg+'s quantization can add to one value of the weighted mean of
    sites with training-set sizes ``weights``, for clipping ``bound``.

    Each site's scaled difference (at most 1 after clipping, times its weight ratio ``r_i <=
    1``) is rounded to a step of ``2 / Q`` (stochastically: error below one step), and its
    ratio to the nearest ``1 / Q``; the mean divides by the rounded ratios' sum."""
    q = quantization_range(len(weights))
    ratios = [w / max(weights) for w in weights]
    total = sum(ratios)
    steps = len(weights) * 2.0 / q  # the sum's rounding, in scaled units
    ratio_error = len(weights) * 0.5 / q  # the rounded ratios' sum, relative to one value
    return bound * (steps + ratio_error * 2.0) / (total - ratio_error)


def refusal(
    *,
    n_sites: int,
    per_round: int,
    algorithm_reason: str,
    wire_precision: str,
    wire_delta: bool,
    bound: float,
    two_sites: bool = False,
) -> str:
    """Why these settings cannot run under secure aggregation ("" when they can).

    ``two_sites``: the operator accepted that with two sites each recovers the other's update."""
    if n_sites < 2:
        return (
            "secure aggregation needs at least 2 sites: the sum of one site's update is that "
            "update; name more sites (3 or more, so that a site may drop out)"
        )
    if per_round < 2:
        return (
            f"secure aggregation needs at least 2 sites in every round, but this run samples "
            f"{per_round}; raise --min-sites to 2 (or client_fraction)"
        )
    if algorithm_reason:
        return algorithm_reason
    if wire_precision != "float32" or wire_delta:
        return (
            "secure aggregation sends its own quantized form of each update, which needs the "
            f"float32 wire (wire_precision={wire_precision!r}, wire_delta={wire_delta}): int8 "
            "and float16 updates and delta downlinks do not add up linearly under masks; "
            "leave wire_precision and wire_delta at their defaults"
        )
    if not (math.isfinite(bound) and bound > 0):
        return f"--secure-bound must be a number > 0, got {bound}"
    if n_sites == 2 and not two_sites:
        return (
            "with only 2 sites, each site can recover the other's update from the mean it "
            "receives (the mean less its own update), so secure aggregation hides nothing "
            "between them; add a third site, or accept this with --secure-aggregation-two-sites "
            "(run config 'secure-aggregation-two-sites'; docs/privacy.md, 'Threat model')"
        )
    return ""


# ---------------------------------------------------------------------- messages
def to_fitins(content: RecordDict) -> FitIns:
    """medfed's message (JSON config records, array records) as a legacy ``FitIns``, the form
    SecAgg+ carries to a site."""
    arrays, index = [], []
    for name, record in content.array_records.items():
        for key, array in record.items():
            index.append([name, key])
            arrays.append(array.numpy())
    records = {name: str(record["json"]) for name, record in content.config_records.items()}
    config = {"medfed": json.dumps({"config": records, "arrays": index})}
    return FitIns(ndarrays_to_parameters(arrays), config)


def from_fitins(content: RecordDict) -> RecordDict:
    """medfed's message back from the legacy form (:func:`to_fitins`) on the site."""
    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    packed = json.loads(str(fitins.config["medfed"]))
    out = RecordDict(
        {name: ConfigRecord({"json": text}) for name, text in packed["config"].items()}
    )
    grouped: dict[str, dict[str, Array]] = {}
    arrays = parameters_to_ndarrays(fitins.parameters)
    for (name, key), array in zip(packed["arrays"], arrays, strict=True):
        grouped.setdefault(name, {})[key] = Array(np.ascontiguousarray(array))
    for name, record in grouped.items():
        out[name] = ArrayRecord(record)
    return out


def fitres_content(vectors: list[np.ndarray], n_train: int, result: dict[str, Any]) -> RecordDict:
    """A site's reply in the legacy form SecAgg+ masks: its scaled update as the parameters,
    its training-set size as the weight, and its figures (loss, metrics) as JSON."""
    fitres = FitRes(
        Status(Code.OK, "ok"),
        ndarrays_to_parameters(vectors),
        n_train,
        {"json": json.dumps(result)},
    )
    return compat.fitres_to_recorddict(fitres, keep_input=False)


def scaled_update(
    received: dict[str, Any], sent: dict[str, Any], keys: list[str], bound: float
) -> tuple[list[np.ndarray], int]:
    """A site's update as SecAgg+ takes it: for each key, ``(sent - received)`` clipped to
    ``+-bound`` (:data:`INT_BOUND` for integer buffers) and divided by it; and how many values
    were clipped."""
    vectors, clipped = [], 0
    for key in keys:
        new, old = sent[key], received[key]
        limit = bound if new.is_floating_point() else INT_BOUND
        diff = new.detach().cpu().double().numpy() - old.detach().cpu().double().numpy()
        clipped += int(np.count_nonzero(np.abs(diff) > limit))
        vectors.append(np.clip(diff, -limit, limit) / limit)
    return vectors, clipped


def mean_state(
    vectors: list[np.ndarray], keys: list[str], sent: dict[str, Any], bound: float
) -> dict[str, Any]:
    """The new global state from SecAgg+'s weighted mean of the scaled updates: what the server
    sent plus the mean difference (integer buffers rounded back)."""
    import torch

    if len(vectors) != len(keys):
        raise ValueError(f"the secure aggregate holds {len(vectors)} tensors, expected {len(keys)}")
    out = {}
    for key, vector in zip(keys, vectors, strict=True):
        old = sent[key]
        limit = bound if old.is_floating_point() else INT_BOUND
        if tuple(vector.shape) != tuple(old.shape):
            raise ValueError(
                f"the secure aggregate's {key} has shape {tuple(vector.shape)}, expected "
                f"{tuple(old.shape)}"
            )
        value = (
            old.detach().cpu().double() + torch.from_numpy(np.asarray(vector, np.float64)) * limit
        )
        out[key] = value.to(old.dtype) if old.is_floating_point() else value.round().to(old.dtype)
    return out


def content_bytes(content: RecordDict) -> int:
    """Bytes a message's records hold (arrays' data, config values), as they travel."""
    total = 0
    for record in content.array_records.values():
        total += sum(len(array.data) for array in record.values())
    for record in content.config_records.values():
        for value in record.values():
            items = value if isinstance(value, list) else [value]
            total += sum(len(v) if isinstance(v, bytes | str) else 8 for v in items)
    for record in content.metric_records.values():
        total += 8 * len(record)
    return total


# ---------------------------------------------------------------------- the server's round
@dataclass
class SecureRound:
    """What one round of SecAgg+ gave the server: the mean of the updates it could unmask, the
    sites whose masked updates it received (with their figures; when the protocol halts after
    that, their updates are in no sum), and why each other site is missing."""

    vectors: list[np.ndarray] | None  # the weighted mean of the scaled updates; None: halted
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # node -> its figures
    missing: dict[int, str] = field(default_factory=dict)  # node -> why it is not in the sum
    bytes_up: dict[int, int] = field(default_factory=dict)  # node -> bytes of its replies
    halted: str = ""  # why no aggregate came out


class _Tally:
    """The grid as SecAgg+ uses it, counting each node's bytes, keeping the figures each node
    sent with its masked update, and noting why a node fell out (its error, or no reply) at
    which stage."""

    def __init__(self, grid: Any) -> None:
        self.grid, self.stage = grid, 0
        self.bytes_up: dict[int, int] = {}
        self.missing: dict[int, str] = {}
        self.results: dict[int, dict[str, Any]] = {}  # node -> figures sent with its update
        self.last_asked: set[int] = set()

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Any]:
        messages = list(messages)
        asked = {m.metadata.dst_node_id for m in messages}
        stage = STAGES[min(self.stage, len(STAGES) - 1)]
        self.stage += 1
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        answered = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                reason = _error_text(reply.error.reason)
                self.missing.setdefault(node, f"failed during SecAgg+ {stage}: {reason}")
            else:
                self.bytes_up[node] = self.bytes_up.get(node, 0) + content_bytes(reply.content)
                if stage == STAGES[2]:
                    self.results[node] = _figures(reply.content)
        for node in asked - answered:
            self.missing.setdefault(node, f"no reply within {timeout:g} s during SecAgg+ {stage}")
        self.last_asked = asked
        return replies


def _figures(content: RecordDict) -> dict[str, Any]:
    """The figures (loss, metrics) a site sent beside its masked update; {} if unreadable."""
    try:
        result = json.loads(str(content.config_records["fitres.metrics"]["json"]))
    except (KeyError, TypeError, ValueError):
        return {}
    return result if isinstance(result, dict) else {}


def _error_text(reason: str) -> str:
    """The message of a ClientApp's exception, as Flower reports it
    (``<class 'medfed.core.errors.X'>:<'the message'>``)."""
    match = re.fullmatch(r"<class '([^']*)'>:<'(.*)'>", reason, flags=re.DOTALL)
    return match.group(2) if match else reason


def secure_round(
    grid: Any,
    round_: int,
    contents: dict[int, RecordDict],
    weights: dict[int, int],
    timeout: float,
) -> SecureRound:
    """One round of training under SecAgg+: each node in ``contents`` trains on its message and
    sends its masked update; the server gets back only their weighted mean."""
    from flwr.app import Context
    from flwr.common import ndarrays_to_parameters as to_parameters
    from flwr.server import ServerConfig, SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    tally = _Tally(grid)
    proxies = {GridClientProxy(n, grid, 0): to_fitins(c) for n, c in contents.items()}
    strategy = _OneRound(proxies)
    clients = SimpleClientManager()
    for proxy in proxies:
        clients.register(proxy)
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: round_}),
            MAIN_PARAMS_RECORD: compat.parameters_to_arrayrecord(to_parameters([]), True),
        }
    )
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
        config=ServerConfig(num_rounds=1),
        strategy=strategy,  # type: ignore[arg-type]
        client_manager=clients,
    )
    n = len(contents)
    workflow = SecAggPlusWorkflow(
        num_shares=1.0,  # every sampled site is every other's neighbour
        reconstruction_threshold=threshold(n),
        max_weight=float(max(weights.values())),
        clipping_range=1.0,  # the sites' own scaling (bound) already holds every value to +-1
        quantization_range=quantization_range(n),
        modulus_range=MODULUS,
        timeout=timeout,
    )
    halted = ""
    try:
        workflow(tally, context)  # type: ignore[arg-type]
    except Exception as exc:  # a malformed reply must end the round, never the run
        halted = f"SecAgg+ failed: {type(exc).__name__}: {exc}"
    out = SecureRound(
        strategy.vectors,
        results={node: r for node, r in tally.results.items() if node in contents},
        missing=dict(tally.missing),
        bytes_up=dict(tally.bytes_up),
    )
    for node in contents:
        if node not in out.results:
            out.missing.setdefault(node, "left SecAgg+ before sending its masked update")
    if out.vectors is None:
        active = n - len(tally.missing)
        out.halted = halted or (
            f"SecAgg+ halted: {active} of {n} sampled site(s) took part to the end, and it needs "
            f"{threshold(n)} to unmask the sum; no update of this round reached the model"
        )
    return out


class _OneRound:
    """The legacy strategy SecAgg+ asks for: it hands out the round's prepared messages and
    keeps the unmasked aggregate (never a single site's update: SecAgg+ passes only the sum)."""

    def __init__(self, fitins: dict[Any, FitIns]) -> None:
        self.fitins = fitins
        self.vectors: list[np.ndarray] | None = None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any):
        return list(self.fitins.items())

    def aggregate_fit(self, server_round: int, results: list, failures: list):
        if results:
            self.vectors = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}


def max_weight(context: Any) -> float:
    """The largest weight this round's SecAgg+ set up for, as ``secaggplus_mod`` keeps it in
    the site's context."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE

    return float(context.state.config_records[RECORD_KEY_STATE]["max_weight"])
