"""Expert-parallel load balancing (EPLB): where each MoE layer's experts live.

With expert parallelism the E logical experts of an MoE layer are spread over R ranks
(devices), S physical expert slots each: P = R x S >= E slots, the P - E extra ones
holding replicas of some experts. A token routed to logical expert e runs on one of e's
replicas. Routers favour some experts, and the rank holding a hot one bounds the step
of every rank. EPLB (DeepSeek-V3's) counts each expert's tokens over a window of recent
steps (`ExpertLoadWindow`) and re-places the experts (`rebalance_experts`):

1. replicate (`replicate_experts`): every expert gets one replica; each of the P - E
   extra replicas goes, one at a time, to the expert whose load per replica is the
   largest (ties: the lower expert id). A replica serves load[e] / replicas[e]; this
   greedy choice gives the smallest possible largest load per replica.
2. pack (`balanced_packing`): the replicas, heaviest first (ties: the lower index),
   each go to the rank whose load so far is the smallest among those with a free slot
   (ties: the lower rank); every rank ends with exactly S replicas.

Hierarchically, when the experts form G groups (DeepSeek's routing groups, consecutive
ids) and the R ranks sit on N nodes with G divisible by N, whole groups are packed onto
nodes first (G / N groups each, by group load, step 2), then each node replicates and
packs its own experts on its R / N ranks: a token's experts, all in its few chosen
groups, then live on few nodes. Otherwise the placement is global (one node).

The result, an `ExpertPlacement`, maps physical slots to logical experts per layer; an
MoE layer (`model.moe.SparseMoeBlock.set_placement`) holds one weight copy per slot and
sends each (token, expert) pair to one of the expert's replicas. `rank_loads` gives the
load of each rank under a placement, `imbalance` their max / mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _loads(load: object, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(load, dtype=np.float64)
    if arr.ndim != ndim or arr.shape[-1] == 0:
        raise ValueError(f"{name} must have {ndim} axes and at least one expert, got {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite loads >= 0")
    return arr


def balanced_packing(weights: Sequence[float] | np.ndarray, num_packs: int) -> np.ndarray:
    """Pack n weighted items into `num_packs` packs of n / num_packs items each.

    Items are taken heaviest first (ties: the lower index); each goes to the pack with
    the smallest total so far among the packs not yet full (ties: the lower pack).

    Args:
        weights: n finite weights >= 0.
        num_packs: int >= 1 dividing n.
    Returns:
        int64 (n,): the pack of each item.
    Raises:
        ValueError: num_packs not an int >= 1 or not dividing n, a negative or
            non-finite weight.
    """
    w = _loads(weights, "weights", 1)
    packs = _positive_int(num_packs, "num_packs")
    if len(w) % packs:
        raise ValueError(f"num_packs ({packs}) must divide the {len(w)} items")
    per_pack = len(w) // packs
    totals, counts = np.zeros(packs), np.zeros(packs, np.int64)
    out = np.empty(len(w), np.int64)
    for item in np.argsort(-w, kind="stable"):
        open_packs = np.flatnonzero(counts < per_pack)
        pack = open_packs[np.argmin(totals[open_packs])]  # argmin: the first of ties
        out[item] = pack
        totals[pack] += w[item]
        counts[pack] += 1
    return out


def replicate_experts(load: Sequence[float] | np.ndarray, num_replicas: int) -> np.ndarray:
    """Give n experts `num_replicas` replicas, the extra ones to the hottest per replica.

    Every expert starts with one replica; each of the num_replicas - n others goes to
    the expert with the largest load / replicas (ties: the lower id). No other
    assignment (each expert >= 1 replica) has a smaller largest load per replica.

    Args:
        load: n finite loads >= 0.
        num_replicas: int >= n.
    Returns:
        int64 (n,): each expert's replica count (they sum to num_replicas).
    Raises:
        ValueError: num_replicas < n, a negative or non-finite load.
    """
    w = _loads(load, "load", 1)
    total = _positive_int(num_replicas, "num_replicas")
    if total < len(w):
        raise ValueError(f"num_replicas ({total}) must be at least the {len(w)} experts")
    counts = np.ones(len(w), np.int64)
    for _ in range(total - len(w)):
        counts[np.argmax(w / counts)] += 1  # argmax: the first of ties
    return counts


@dataclass(frozen=True)
class ExpertPlacement:
    """Which logical expert each physical slot of each MoE layer holds.

    physical_to_logical: int64 (layers, P); slot p sits on rank p // (P / num_ranks).
    Every logical expert 0..E-1 has at least one slot in every layer.
    """

    physical_to_logical: np.ndarray
    num_ranks: int
    num_experts: int

    def __post_init__(self) -> None:
        layers, slots = self.physical_to_logical.shape
        if slots % self.num_ranks:
            raise ValueError(
                f"the {slots} physical experts must be a multiple of num_ranks ({self.num_ranks})"
            )
        for layer in range(layers):
            counts = np.bincount(self.physical_to_logical[layer], minlength=self.num_experts)
            if len(counts) != self.num_experts or not np.all(counts >= 1):
                raise ValueError(f"layer {layer} must place each of {self.num_experts} experts")

    @classmethod
    def identity(cls, num_layers: int, num_experts: int, num_ranks: int) -> ExpertPlacement:
        """No replicas, expert e in slot e (rank e // (E / R)): the placement without EPLB.

        Raises:
            ValueError: num_ranks not dividing num_experts (the EP size must divide the
                expert count when there are no redundant slots).
        """
        if num_experts % _positive_int(num_ranks, "num_ranks"):
            raise ValueError(
                f"num_ranks ({num_ranks}) must divide the {num_experts} experts "
                f"(or give redundant slots: rebalance_experts)"
            )
        table = np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))
        return cls(table, num_ranks, num_experts)

    def replica_counts(self) -> np.ndarray:
        """int64 (layers, E): the slots each logical expert has."""
        return np.stack(
            [np.bincount(row, minlength=self.num_experts) for row in self.physical_to_logical]
        )

    def rank_loads(self, load: np.ndarray) -> np.ndarray:
        """float64 (layers, R): each rank's load when logical expert e's load (layers, E)
        is split evenly over its replicas."""
        load = _loads(load, "load", 2)
        per_replica = load / self.replica_counts()
        slot_loads = np.take_along_axis(per_replica, self.physical_to_logical, axis=1)
        return slot_loads.reshape(len(load), self.num_ranks, -1).sum(axis=2)

    def imbalance(self, load: np.ndarray) -> np.ndarray:
        """float64 (layers,): max / mean of `rank_loads` (1 is perfect balance; a layer
        without load counts as 1)."""
        ranks = self.rank_loads(load)
        mean = ranks.mean(axis=1)
        return np.where(mean > 0, ranks.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)


def _place(load: np.ndarray, slots: int, ranks: int) -> np.ndarray:
    """One layer's experts `load` (n,) replicated onto `slots` slots packed on `ranks`
    ranks: the logical expert (index into load) of each slot, rank by rank."""
    counts = replicate_experts(load, slots)
    replicas = np.repeat(np.arange(len(load)), counts)  # expert ids, replicas together
    rank_of = balanced_packing(load[replicas] / counts[replicas], ranks)
    return replicas[np.argsort(rank_of, kind="stable")]


def rebalance_experts(
    load: np.ndarray,
    num_physical_experts: int,
    num_ranks: int,
    num_groups: int = 1,
    num_nodes: int = 1,
) -> ExpertPlacement:
    """EPLB's placement of every layer's experts from their loads (module docstring).

    Hierarchical when num_groups is a multiple of num_nodes (groups packed onto nodes by
    `balanced_packing` of their loads, then replication and packing within each node on
    its num_ranks / num_nodes ranks); global otherwise. Within a rank, slots hold their
    replicas in increasing expert id (stable order of the replication).

    Args:
        load: (layers, E) finite loads >= 0 (tokens per expert over a window).
        num_physical_experts: P, a multiple of num_ranks and >= E.
        num_ranks: R, the EP size, a multiple of num_nodes.
        num_groups: G dividing E (DeepSeek's expert groups; 1: none).
        num_nodes: N >= 1.
    Returns:
        The placement, P slots per layer, P / R on each rank.
    Raises:
        ValueError: a count that does not divide (P by R, R by N, E by G), P < E, a
            negative or non-finite load.
    """
    load = _loads(load, "load", 2)
    layers, experts = load.shape
    slots = _positive_int(num_physical_experts, "num_physical_experts")
    ranks = _positive_int(num_ranks, "num_ranks")
    groups = _positive_int(num_groups, "num_groups")
    nodes = _positive_int(num_nodes, "num_nodes")
    if slots % ranks:
        raise ValueError(
            f"num_physical_experts ({slots}) must be a multiple of num_ranks ({ranks}), the EP size"
        )
    if slots < experts:
        raise ValueError(f"num_physical_experts ({slots}) must be at least the {experts} experts")
    if ranks % nodes:
        raise ValueError(f"num_ranks ({ranks}) must be a multiple of num_nodes ({nodes})")
    if experts % groups:
        raise ValueError(f"num_groups ({groups}) must divide the {experts} experts")
    if groups % nodes:
        groups, nodes = 1, 1  # the groups cannot be split evenly over the nodes: global
    per_group = experts // groups
    table = np.empty((layers, slots), np.int64)
    for layer in range(layers):
        group_load = load[layer].reshape(groups, per_group).sum(axis=1)
        node_of_group = balanced_packing(group_load, nodes)
        placed = []
        for node in range(nodes):
            ids = np.concatenate(
                [
                    np.arange(g * per_group, (g + 1) * per_group)
                    for g in np.flatnonzero(node_of_group == node)
                ]
            )
            placed.append(ids[_place(load[layer, ids], slots // nodes, ranks // nodes)])
        table[layer] = np.concatenate(placed)
    return ExpertPlacement(table, ranks, experts)


class ExpertLoadWindow:
    """Tokens routed to each logical expert of each MoE layer over the last `window`
    steps: `record` adds a step's routing choices, `advance` starts the next step (the
    oldest one leaves the window), `load` sums the window."""

    def __init__(self, num_layers: int, num_experts: int, window: int) -> None:
        self.window = _positive_int(window, "window")
        self.counts = np.zeros((self.window, num_layers, num_experts), np.int64)
        self.step = 0

    def record(self, layer: int, expert_ids: np.ndarray) -> None:
        """Count the routing choices `expert_ids` (any shape, logical ids) of MoE layer
        `layer` (its index among the MoE layers) into the current step."""
        ids = np.asarray(expert_ids, dtype=np.int64).reshape(-1)
        self.counts[self.step % self.window, layer] += np.bincount(
            ids, minlength=self.counts.shape[2]
        )

    def advance(self) -> None:
        """Start the next step, forgetting the oldest one in the window."""
        self.step += 1
        self.counts[self.step % self.window] = 0

    def load(self) -> np.ndarray:
        """int64 (layers, E): the tokens of each expert over the window."""
        return self.counts.sum(axis=0)


@dataclass(frozen=True)
class EPLBConfig:
    """How an engine keeps a mixture of experts balanced (vLLM's EPLB settings, plus the
    expert-parallel layout the placement is for).

    num_ranks: the EP size R (ranks the experts are spread over), >= 1.
    num_redundant_experts: extra physical slots for replicas; E + this must be a multiple
        of num_ranks.
    num_nodes: nodes the ranks sit on (a divisor of num_ranks); with the model's expert
        groups divisible by it, the placement is hierarchical.
    window_size: steps of expert load the placement is computed from, >= 1.
    step_interval: steps between two re-placements, >= 1.
    """

    num_ranks: int
    num_redundant_experts: int = 0
    num_nodes: int = 1
    window_size: int = 1000
    step_interval: int = 3000

    def __post_init__(self) -> None:
        for name in ("num_ranks", "num_nodes", "window_size", "step_interval"):
            _positive_int(getattr(self, name), f"eplb.{name}")
        extra = self.num_redundant_experts
        if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
            raise ValueError(f"eplb.num_redundant_experts must be an int >= 0, got {extra!r}")

    @classmethod
    def from_dict(cls, value: dict) -> EPLBConfig:
        """From a dict of the fields (a JSON object on the command line)."""
        known = list(cls.__dataclass_fields__)
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"eplb has unknown keys {unknown}; its keys are {known}")
        if "num_ranks" not in value:
            raise ValueError(f"eplb needs num_ranks, got {value!r}")
        return cls(**value)


class ExpertBalancer:
    """Keeps an MoE model's experts placed for its recent load: the model records its
    routing choices into a window of `window_size` steps, and every `step_interval`
    steps `step` re-places the experts (`rebalance_experts`) and applies the placement
    to every MoE layer. Starts from the placement without replicas spread over the
    slots (`rebalance_experts` of a uniform load).

    Raises:
        ValueError: a model without MoE layers, or expert counts that do not divide the
            EP size (E + num_redundant_experts not a multiple of num_ranks, num_ranks
            not a multiple of num_nodes).
    """

    def __init__(self, model, config: EPLBConfig) -> None:
        blocks = model.moe_blocks() if hasattr(model, "moe_blocks") else []
        if not blocks:
            raise ValueError(
                f"eplb needs a mixture of experts, and {model.config.architecture} has no MoE layer"
            )
        moe = model.config.moe
        self.config, self.model = config, model
        self.num_physical = moe.num_experts + config.num_redundant_experts
        self.num_groups = moe.grouped.num_groups if moe.grouped is not None else 1
        uniform = np.ones((len(blocks), moe.num_experts))
        self.placement = rebalance_experts(
            uniform, self.num_physical, config.num_ranks, self.num_groups, config.num_nodes
        )
        self.window = model.record_expert_load(config.window_size)
        model.apply_expert_placement(self.placement)
        self.steps = self.rebalances = 0

    def step(self) -> bool:
        """End a step: advance the window and, every step_interval steps, re-place the
        experts for the window's load. Returns whether it re-placed them."""
        self.steps += 1
        due = self.steps % self.config.step_interval == 0
        if due:
            self.placement = rebalance_experts(
                self.window.load(),
                self.num_physical,
                self.config.num_ranks,
                self.num_groups,
                self.config.num_nodes,
            )
            self.model.apply_expert_placement(self.placement)
            self.rebalances += 1
        self.window.advance()
        return due

    def imbalance(self) -> np.ndarray:
        """max / mean load per rank of each MoE layer, under the current placement, for
        the window's load."""
        return self.placement.imbalance(self.window.load())
