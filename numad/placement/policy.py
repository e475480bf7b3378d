"""Topology Manager policies: options, the policy step around the merge, admission.

Pure core. ``TopologyPolicy.merge`` takes the hints of every provider and
returns a ``Decision``: the merged hint, whether the workload is admitted, and
an explanation (numad.placement.explain) of why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from numad.cpuset import NodeSet
from numad.errors import ConfigError
from numad.placement.hints import Hint, HintList, ProviderHints, flatten
from numad.placement.hintspace import forget_searches
from numad.placement.merge import Distance, Merged, Merger, Strategy
from numad.placement.search import LISTABLE, Search, SearchBudgetError

# The kubelet refuses machines with more than 8 nodes because its merge walks
# the whole product (about an hour of CPU for one admission at 12 nodes).
# numad's providers describe their hints and its merge searches them
# (numad.placement.search), so numad sets no limit of its own; the option keeps the
# kubelet's meaning where a config sets it.
DEFAULT_MAX_NUMA_NODES: int | None = None
KUBELET_MIN_MAX_NUMA_NODES = 8


class Policy(StrEnum):
    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    prefer_closest: bool = False
    max_numa_nodes: int | None = DEFAULT_MAX_NUMA_NODES
    strategy: Strategy = Strategy.NONE
    weights: Mapping[str, int] | None = None
    # numad's own (the kubelet has none): under best-effort, a container whose request no
    # single preferred mask holds gets its CPUs and memory per device node
    # (numad.placement.groups); off, every placement is the kubelet's.
    align_per_resource: bool = False


@dataclass(frozen=True, slots=True)
class Machine:
    """What the merge needs of the machine: its nodes and, for prefer-closest, distances."""

    nodes: NodeSet
    distances: Mapping[int, Mapping[int, int]] | None = None

    def distance(self, a: int, b: int) -> int:
        if self.distances is None:
            raise ConfigError("prefer-closest-numa-nodes", "the machine has no NUMA distances")
        return self.distances[a].get(b, 0)


@dataclass(frozen=True, slots=True)
class Decision:
    """The merged hint and the admission outcome. ``affinity`` None: any node."""

    affinity: NodeSet | None
    preferred: bool
    score: int
    admit: bool
    policy: Policy
    lists: tuple[HintList, ...] = field(default=(), repr=False, compare=False)


# The Topology Manager's policy options numad knows (parse_options reads each); all but
# align-per-resource, numad's own, are the kubelet's.
OPTIONS = (
    "align-per-resource",
    "max-allowable-numa-nodes",
    "numa-allocation-strategy",
    "numa-score-weights",
    "prefer-closest-numa-nodes",
)


def parse_options(policy: Policy, raw: Mapping[str, str]) -> PolicyOptions:
    """Options as the kubelet's --topology-manager-policy-options spells them (and
    numad's align-per-resource, spelled as they are)."""
    options = PolicyOptions()
    for name, value in raw.items():
        if name == "prefer-closest-numa-nodes":
            options = replace(options, prefer_closest=_parse_bool(name, value))
        elif name == "max-allowable-numa-nodes":
            options = replace(options, max_numa_nodes=_parse_max_nodes(value))
        elif name == "numa-allocation-strategy":
            options = replace(options, strategy=_parse_strategy(value))
        elif name == "numa-score-weights":
            options = replace(options, weights=parse_weights(value))
        elif name == "align-per-resource":
            options = replace(options, align_per_resource=_parse_bool(name, value))
        else:
            raise ConfigError(name, f'unknown Topology Manager Policy option: "{name}"')
    return options


def check_machine(policy: Policy, options: PolicyOptions, machine: Machine) -> None:
    """The start-up checks: the node limit, and distances for prefer-closest."""
    if policy is Policy.NONE:
        return
    limit = options.max_numa_nodes
    if limit is not None and len(machine.nodes) > limit:
        raise ConfigError(
            "[topology] options max-allowable-numa-nodes",
            f"this machine has {len(machine.nodes)} NUMA nodes, more than the"
            f" max-allowable-numa-nodes of {limit} set in the config",
            "raise it, or remove it from options in [topology] of the config file"
            " (/etc/numad/numad.toml or --config): numad has no limit of its own",
        )
    if (
        options.prefer_closest
        and policy is not Policy.SINGLE_NUMA_NODE
        and machine.distances is None
    ):
        raise ConfigError(
            "prefer-closest-numa-nodes",
            "cannot discover NUMA topology: error getting NUMA distances",
        )


def merge(
    policy: Policy,
    options: PolicyOptions,
    machine: Machine,
    providers: Sequence[ProviderHints],
) -> Decision:
    """The policy's merge of every provider's hints, and whether to admit."""
    if policy is Policy.NONE:
        return Decision(None, preferred=False, score=0, admit=True, policy=policy)
    forget_searches()  # what one merge remembers is not carried into the next (nor timed)
    lists = flatten(providers)
    described = any(hl.space is not None for hl in lists)
    if policy is Policy.SINGLE_NUMA_NODE:
        lists = tuple(_single_numa_filter(hl) for hl in lists)
    closest = options.prefer_closest and policy is not Policy.SINGLE_NUMA_NODE
    distance = machine.distance if closest else None
    if described or len(machine.nodes) > LISTABLE:
        result = _search(lists, machine.nodes.bits, distance)
    else:
        result = Merger(
            lists,
            machine.nodes.bits,
            distance=distance,
            strategy=options.strategy,
            weights=options.weights,
        ).run()
    affinity: NodeSet | None = NodeSet.from_bits(result.mask)
    score = result.score
    if policy is Policy.SINGLE_NUMA_NODE and result.mask == machine.nodes.bits:
        # The kubelet reports "any node" for a result that spans the machine
        # (always so on a one-node machine). The score is dropped with it (the
        # reference's reading of an unstored kubelet detail, section 3.4).
        affinity, score = None, 0
    admit = policy is Policy.BEST_EFFORT or result.preferred
    return Decision(affinity, result.preferred, score, admit, policy, lists)


def _search(lists: Sequence[HintList], default: int, distance: Distance | None) -> Merged:
    """The merge by search; past its budget, the fold of listed hints where the
    machine is small enough to list them, else the documented rule (numad.placement.search)."""
    search = Search(lists, default, distance=distance)
    try:
        return search.run()
    except SearchBudgetError:
        if default.bit_count() <= LISTABLE:
            listed = [hl if hl.space is None else _listed(hl) for hl in lists]
            return Merger(listed, default, distance=distance).run()
        return search.fallback()


def _listed(hl: HintList) -> HintList:
    assert hl.space is not None
    hints = hl.space.materialize()
    return replace(hl, hints=hints, given=hints, space=None)


def _single_numa_filter(hl: HintList) -> HintList:
    if hl.space is not None:  # the one-node preferred hints, listed
        space = hl.space
        kept = tuple(
            Hint(NodeSet([n]), preferred=True) for n in space.node_ids() if space.preferred(1 << n)
        )
        return replace(hl, hints=kept, space=None)  # ``given`` stays: it had hints
    kept = tuple(
        h for h in hl.hints if h.preferred and (h.affinity is None or len(h.affinity) == 1)
    )
    return replace(hl, hints=kept)


def parse_weights(value: str) -> dict[str, int]:
    weights: dict[str, int] = {}
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, number = entry.partition("=")
        name, number = name.strip(), number.strip()
        if not sep:
            raise _weights_error(f'invalid weight entry "{entry}": expected resource=weight')
        if not name:
            raise _weights_error(f'empty resource name in weight entry "{entry}"')
        try:
            weight = int(number)
        except ValueError:
            raise _weights_error(f'invalid weight value for "{name}": {number!r}') from None
        if not 0 <= weight <= 100:
            raise _weights_error(f'weight for "{name}" must be in range [0, 100], got {weight}')
        weights[name] = weight
    return weights


def _weights_error(problem: str) -> ConfigError:
    return ConfigError(
        "numa-score-weights", f'bad value for option "numa-score-weights": {problem}'
    )


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _parse_bool(name: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(name, f'bad value for option "{name}": invalid syntax {value!r}')


def _parse_max_nodes(value: str) -> int:
    name = "max-allowable-numa-nodes"
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(name, f"unable to convert policy option to integer {value!r}") from None
    if number < KUBELET_MIN_MAX_NUMA_NODES:
        raise ConfigError(
            name,
            f'the minimum value of "{name}" should not be less than {KUBELET_MIN_MAX_NUMA_NODES}',
        )
    return number


def _parse_strategy(value: str) -> Strategy:
    if value == "":
        return Strategy.NONE
    try:
        return Strategy(value)
    except ValueError:
        raise ConfigError(
            "numa-allocation-strategy",
            f'bad value for option "numa-allocation-strategy": "{value}" must be one of '
            '["least-allocated" "most-allocated" "none"]',
        ) from None
