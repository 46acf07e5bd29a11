"""A program as the project sees it: its Linalg ops with their loops, operands, access
matrices and bodies, and the graph between them (`Program`; `ir.load_program` makes one from
MLIR)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlirrl_jax.errors import Error


class ProgramError(Error, ValueError):
    """Input the project cannot turn into a schedulable program; the message names why."""


@dataclass(frozen=True)
class Loop:
    """One loop of an op's iteration space."""

    extent: int
    iterator: str  # "parallel" | "reduction"


@dataclass(frozen=True)
class Operand:
    """One operand of a Linalg op and how the loops index it.

    `access` is the (rank, n_loops) coefficient matrix and `offset` the (rank,) constant of the
    affine indexing map: index[j] = sum_l access[j][l] * iv[l] + offset[j].
    `source` says where the value comes from: ("arg", k) a kernel input, ("op", (op_id, result)),
    ("empty", None) an uninitialised tensor, ("scalar", value) a scalar constant (fill values).
    """

    shape: tuple[int, ...]
    element_type: str
    access: tuple[tuple[int, ...], ...]
    offset: tuple[int, ...]
    is_output: bool
    source: tuple


@dataclass(frozen=True)
class BodyOp:
    """One scalar op of an op's body, in SSA order.

    Values are numbered: 0..n_operands-1 are the block arguments (inputs then outputs), then one
    number per body op result in order. `attrs` holds what the op needs to be evaluated
    (a constant's value, a comparison predicate, a `linalg.index` dimension).
    """

    name: str
    operands: tuple[int, ...]
    result_type: str
    attrs: tuple[tuple[str, object], ...] = ()


@dataclass
class LinalgOp:
    """A Linalg op of a program, in its generic form."""

    id: int
    name: str  # the op as written, e.g. "linalg.conv_2d_nhwc_hwcf"
    kind: str  # matmul, batch_matmul, conv2d, depthwise_conv, pooling, fill, elementwise, ...
    loops: list[Loop]
    operands: list[Operand]
    body: list[BodyOp]
    yields: tuple[int, ...]
    arith_counts: dict[str, int]

    @property
    def n_loops(self) -> int:
        return len(self.loops)

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(loop.extent for loop in self.loops)

    @property
    def inputs(self) -> list[Operand]:
        return [o for o in self.operands if not o.is_output]

    @property
    def outputs(self) -> list[Operand]:
        return [o for o in self.operands if o.is_output]

    @property
    def reduction_size(self) -> int:
        size = 1
        for loop in self.loops:
            if loop.iterator == "reduction":
                size *= loop.extent
        return size

    @property
    def flops(self) -> int:
        """Arithmetic ops of the body times the iteration count (a fill counts as 0)."""
        points = 1
        for loop in self.loops:
            points *= loop.extent
        return points * sum(self.arith_counts.values())


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    element_type: str


@dataclass
class Program:
    """A kernel of Linalg ops, ready to schedule, compile and evaluate."""

    name: str
    mlir: str  # normalized module: `@kernel` on memrefs (inputs, then outputs), ops tagged
    inputs: list[TensorType]
    outputs: list[TensorType]
    ops: list[LinalgOp]
    edges: list[tuple[int, int, int]]  # (producer op id, consumer op id, consumer operand index)
    returns: list[tuple]  # per kernel output: ("op", (op_id, result)) or ("arg", k)
    hash: str = field(default="")

    def producers(self, op_id: int) -> list[int]:
        return sorted({p for p, c, _ in self.edges if c == op_id})

    def consumers(self, op_id: int) -> list[int]:
        return sorted({c for p, c, _ in self.edges if p == op_id})

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    def fusion_loop_map(self, op_id: int) -> list[int] | None:
        """If `op_id` can be fused into its consumer's tiled loop: per op loop, the consumer loop
        that tiles it (-1: not tiled by the consumer); else None.

        Fusable means one consumer, a result not returned from the kernel, each output dimension
        indexed by one loop, and the consumer reading it through a projected permutation of its
        parallel loops (so a consumer tile maps to a producer tile of the same sizes).
        """
        consumers = self.consumers(op_id)
        if len(consumers) != 1 or any(r == ("op", (op_id, 0)) for r in self.returns):
            return None
        producer, consumer = self.ops[op_id], self.ops[consumers[0]]
        if len(producer.outputs) != 1:
            return None
        reads = [i for p, c, i in self.edges if p == op_id and c == consumer.id]
        loop_map = [-1] * producer.n_loops
        for index in reads:
            operand = consumer.operands[index]
            if any(operand.offset):
                return None
            for row, out_row in zip(operand.access, producer.outputs[0].access):
                mine = [j for j, c in enumerate(out_row) if c]
                theirs = [j for j, c in enumerate(row) if c]
                if len(mine) != 1 or len(theirs) != 1 or row[theirs[0]] != 1:
                    return None
                if consumer.loops[theirs[0]].iterator != "parallel":
                    return None
                if loop_map[mine[0]] not in (-1, theirs[0]):
                    return None
                loop_map[mine[0]] = theirs[0]
        return loop_map

    def fusion_closure(self, op_id: int) -> list[int]:
        """The producers a tiled fusion of `op_id` pulls into its loop, nearest first."""
        closure, frontier = [], [op_id]
        while frontier:
            current = frontier.pop(0)
            for producer in self.producers(current):
                if self.fusion_loop_map(producer) is not None and producer not in closure:
                    closure.append(producer)
                    frontier.append(producer)
        return closure

    def describe(self) -> str:
        """A short human-readable summary, one line per op."""
        lines = [f"program {self.name} ({self.hash[:12]}): {len(self.ops)} ops"]
        for op in self.ops:
            loops = " ".join(
                f"{lp.extent}{'r' if lp.iterator == 'reduction' else ''}" for lp in op.loops
            )
            lines.append(
                f"  op{op.id} {op.name} [{op.kind}] loops {loops} <- {self.producers(op.id)}"
            )
        return "\n".join(lines)
