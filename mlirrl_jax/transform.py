"""Schedule -> Transform-dialect script (MLIR text) for the program's tagged ops.

The builder follows each op through its transformations: it keeps the op's current handle, the
order of its loops (original indices, after interchanges and decompositions), their current
extents, and the scf.for loops tiling created, so that sizes given in original loop order land
on the right loops. Vector cleanup patterns and the hoisting of loop-invariant transfers run
once, after every op is transformed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlirrl_jax.programs.analysis import packable_inputs, single_loops, window_loops
from mlirrl_jax.programs.ir import OP_ID_ATTR, LinalgOp, Program
from mlirrl_jax.schedule import (
    DECOMPOSE,
    INTERCHANGE,
    PACK,
    TILE,
    TILE_FUSE,
    TILE_PARALLEL,
    VECTORIZE,
    Schedule,
    ScheduleError,
)

ANY = "!transform.any_op"
REDUCTION_TO_CONTRACT = "transform.apply_patterns.vector.reduction_to_contract"
FOR = '!transform.op<"scf.for">'

# Patterns that make vectorized code fast, in stages: first fold transfers and turn reductions
# into contractions, then lower contractions to outer products, then outer products to FMAs.
# One combined pattern set leaves separate mul/add chains (about 1.5x slower matmuls here).
_VECTOR_STAGES = (
    (
        # a masked transfer (a partial tile's) becomes one transfer with a mask operand
        "transform.apply_patterns.vector.lower_masked_transfers",
        "transform.apply_patterns.vector.transfer_permutation_patterns",
        REDUCTION_TO_CONTRACT,
    ),
    (
        'transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"',
        'transform.apply_patterns.vector.lower_multi_reduction lowering_strategy = "innerparallel"',
    ),
    ("transform.apply_patterns.vector.lower_outerproduct",),
)


def _vector_cleanup(func: str, contract: bool = True) -> list[str]:
    """The cleanup stages; without `reduction_to_contract` if not `contract`."""
    lines = []
    for stage in _VECTOR_STAGES:
        lines.append(f"transform.apply_patterns to {func} {{")
        lines += [
            f"  {pattern}" for pattern in stage if contract or pattern != REDUCTION_TO_CONTRACT
        ]
        lines += ["  transform.apply_patterns.canonicalization", f"}} : {ANY}"]
    return lines


def _zero(element_type: str) -> str:
    return (
        f"0.0 : {element_type}" if element_type.startswith(("f", "bf")) else f"0 : {element_type}"
    )


@dataclass
class _OpState:
    handle: str
    order: list[int]  # original loop indices of the current loops, outermost first
    extents: dict[int, int]  # original loop index -> current (tile) extent
    loops: list[str] = field(default_factory=list)  # scf.for handles, outermost first
    in_forall: bool = False
    generalized: bool = False
    # original loops a forall split by a size that does not divide them: its last chunk is
    # partial, so the op's shapes are dynamic and vectorization masks them to the tile's size
    partial: set[int] = field(default_factory=set)
    # scf.for loops whose step does not divide their range, innermost last: peeled once the
    # op's tiling is done, so that every copy of the op has static shapes
    to_peel: list[str] = field(default_factory=list)
    ragged: set[int] = field(default_factory=set)  # original loops with a partial tile
    last_loops: int = 0  # scf.for loops of the last tiling, if nothing but tilings followed
    packed: bool = False


class _Builder:
    def __init__(self, program: Program):
        self.program = program
        self.lines: list[str] = []
        self.counter = 0
        self.states: dict[int, _OpState] = {}
        self.loops_in_order: list[str] = []
        self.vectorized = False
        self.contract = True  # whether the vector cleanup may turn reductions to contractions
        for op in program.ops:
            handle = self.fresh("op")
            self.emit(
                f"{handle} = transform.structured.match attributes {{{OP_ID_ATTR} = {op.id} : i64}}"
                f" in %root : ({ANY}) -> {ANY}"
            )
            self.states[op.id] = _OpState(
                handle, list(range(op.n_loops)), {i: lp.extent for i, lp in enumerate(op.loops)}
            )

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"%{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def match_func(self) -> str:
        """A fresh handle to the kernel function."""
        func = self.fresh("func")
        self.emit(
            f'{func} = transform.structured.match ops{{["func.func"]}} in %root : ({ANY}) -> {ANY}'
        )
        return func

    def current_sizes(self, op: LinalgOp, state: _OpState, sizes: tuple[int, ...], what: str):
        if len(sizes) != op.n_loops:
            raise ScheduleError(f"op {op.id}: {what} has {len(sizes)} sizes for {op.n_loops} loops")
        dropped = [i for i in range(op.n_loops) if i not in state.order and sizes[i]]
        if dropped:
            raise ScheduleError(f"op {op.id}: {what} tiles loops {dropped} that no longer exist")
        # A tile as large as the loop makes a single-iteration loop; canonicalization would fold
        # it away under its handle, so leave such loops untiled (the same code).
        return [sizes[i] if sizes[i] < state.extents[i] else 0 for i in state.order]

    def tile(self, op: LinalgOp, state: _OpState, sizes: tuple[int, ...]) -> None:
        current = self.current_sizes(op, state, sizes, TILE)
        n = sum(1 for s in current if s)
        tiled = self.fresh("t")
        loops = [self.fresh("loop") for _ in range(n)]
        self.emit(
            f"{', '.join([tiled] + loops)} = transform.structured.tile_using_for {state.handle}"
            f" tile_sizes {current} : ({ANY}) -> ({', '.join([ANY] * (n + 1))})"
        )
        state.handle = tiled
        state.loops += loops
        self.loops_in_order += loops
        tiled_loops = [i for i, size in zip(state.order, current) if size]
        for loop, i in zip(loops, tiled_loops):
            # a loop over a partial tile of an outer level has a dynamic range: peeled too,
            # but for a step of 1, which never leaves a partial iteration (and which
            # transform.loop.peel refuses: "failed to peel the last iteration")
            if sizes[i] > 1 and (state.extents[i] % sizes[i] or i in state.ragged):
                state.to_peel.append(loop)
                state.ragged.add(i)
        self._shrink(state, sizes)
        if n:  # a tiling that tiles nothing leaves the last one's loops innermost
            state.last_loops = n

    def pack(self, op: LinalgOp, state: _OpState) -> None:
        """Pad each of `packable_inputs` at the tile's shape (a copy that does not fold away),
        hoist the copies out of the loops of the last tiling (into one panel per outer tile,
        laid out in the order the inner loops read it) and vectorize them: a matmul's B rows
        (a convolution's filter rows) are read at unit stride from the panel instead of one
        row of the whole matrix per reduction step. A sliding window decomposes after it."""
        inputs = packable_inputs(op)
        if not inputs:
            raise ScheduleError(
                f"op {op.id}: pack needs a reduction whose vector lanes walk an input that"
                " another output loop reuses (a matmul's B, a convolution's filter)"
            )
        if state.packed or not state.last_loops:
            raise ScheduleError(
                f"op {op.id}: pack comes once, right after a tiling whose loops it hoists the"
                " panel out of"
            )
        if state.ragged & set(state.order) or state.partial & set(state.order):
            raise ScheduleError(f"op {op.id}: pack needs whole tiles (no partial last tile)")
        flags = [int(k in inputs) for k in range(len(op.operands))]
        values = ", ".join(_zero(o.element_type) for o in op.operands)
        padded, pads, copy = self.fresh("padded"), self.fresh("pads"), self.fresh("copy")
        self.emit(
            f"{padded}, {pads}, {copy} = transform.structured.pad {state.handle} {{padding_values"
            f" = [{values}], padding_dimensions = {list(range(len(state.order)))}, nofold_flags"
            f' = {flags}, copy_back_op = "none"}} : ({ANY}) -> ({ANY}, {ANY}, {ANY})'
        )
        each = [self.fresh("pad") for _ in inputs]
        if len(each) > 1:
            self.emit(
                f"{', '.join(each)} = transform.split_handle {pads} : ({ANY}) -> "
                f"({', '.join([ANY] * len(each))})"
            )
        else:
            each = [pads]
        hoisted = []
        for pad in each:
            hoisted.append(self.fresh("panel"))
            self.emit(
                f"{hoisted[-1]} = transform.structured.hoist_pad {pad} by {state.last_loops}"
                f" loops : ({ANY}) -> {ANY}"
            )
        func = self.match_func()
        self.emit(f"transform.apply_patterns to {func} {{")  # the panels' shapes become static
        self.emit("  transform.apply_patterns.canonicalization")
        self.emit(f"}} : {ANY}")
        for k, panel in zip(inputs, hoisted):
            shape = [state.extents[i] for i in single_loops(op.operands[k].access)]
            self.emit(f"transform.structured.vectorize {panel} vector_sizes {shape} : {ANY}")
        again = self.fresh("op")
        self.emit(
            f"{again} = transform.structured.match attributes {{{OP_ID_ATTR} = {op.id} : i64}}"
            f" in %root : ({ANY}) -> {ANY}"
        )
        state.handle = again
        state.packed = True
        self.vectorized = True  # the panels' transfers get the cleanup

    def peel(self, op: LinalgOp, state: _OpState) -> None:
        """Split each partial scf.for into its whole tiles and the last, partial one, then
        take every copy of the op: their shapes are static, so they vectorize unmasked.

        Peeling invalidates the handles of the loops nested in a peeled one; the copies' loops
        are found again from the copies, innermost first, for the hoisting at the end."""
        if not state.to_peel:
            return
        for loop in reversed(state.to_peel):  # innermost first
            typed, each = self.fresh("for"), self.fresh("each")
            self.emit(f"{typed} = transform.cast {loop} : {ANY} to {FOR}")
            # in a foreach, the peeled halves' handles end with its body: canonicalization
            # below folds the one-iteration remainders, which a live handle would forbid
            self.emit(f"transform.foreach {typed} : {FOR} {{")
            self.emit(f"^bb0({each}: {FOR}):")
            self.emit(
                f"  {self.fresh('main')}, {self.fresh('rest')} = transform.loop.peel {each}"
                f" : ({FOR}) -> ({ANY}, {ANY})"
            )
            self.emit("}")
        func = self.match_func()
        # the bounds peeling made constant become static slice shapes
        self.emit(f"transform.apply_patterns to {func} {{")
        self.emit("  transform.apply_patterns.canonicalization")
        self.emit(f"}} : {ANY}")
        copies = self.fresh("copies")
        self.emit(
            f"{copies} = transform.structured.match attributes {{{OP_ID_ATTR} = {op.id} : i64}}"
            f" in %root : ({ANY}) -> {ANY}"
        )
        first = state.loops.index(state.to_peel[0])
        gone = state.loops[first:]  # the outermost peeled loop and every loop inside it
        found, below = [], copies
        for _ in gone:
            parent = self.fresh("loop")
            self.emit(
                f'{parent} = transform.get_parent_op {below} {{allow_empty_results, op_name = "scf.for",'
                f" deduplicate}} : ({ANY}) -> {ANY}"
            )
            found.insert(0, parent)
            below = parent
        at = self.loops_in_order.index(gone[0])
        self.loops_in_order[at : at + len(gone)] = found
        state.loops[first:] = found
        state.handle = copies
        state.to_peel = []

    def tile_forall(self, op: LinalgOp, state: _OpState, sizes: tuple[int, ...], what: str) -> str:
        current = self.current_sizes(op, state, sizes, what)
        reductions = [i for i in state.order if sizes[i] and op.loops[i].iterator == "reduction"]
        if reductions:
            raise ScheduleError(
                f"op {op.id}: {what} cannot parallelize reduction loops {reductions}"
            )
        if state.in_forall:
            raise ScheduleError(f"op {op.id}: {what} inside a parallel loop it was fused into")
        if not any(current):
            raise ScheduleError(
                f"op {op.id}: {what} {list(sizes)} splits no loop (every size is 0 or at least "
                "its loop's extent)"
            )
        tiled, forall = self.fresh("t"), self.fresh("forall")
        self.emit(
            f"{tiled}, {forall} = transform.structured.tile_using_forall {state.handle}"
            f" tile_sizes {current} : ({ANY}) -> ({ANY}, {ANY})"
        )
        state.handle = tiled
        state.in_forall = True
        self._shrink(state, sizes, forall=True)
        return forall

    def fuse_producers(self, op: LinalgOp, forall: str) -> None:
        """Fuse the op's fusable producers (transitively) into its forall, nearest first."""
        for producer_id in self.program.fusion_closure(op.id):
            state = self.states[producer_id]
            fused, grown = self.fresh("fused"), self.fresh("forall")
            self.emit(
                f"{fused}, {grown} = transform.structured.fuse_into_containing_op"
                f" {state.handle} into {forall} : ({ANY}, {ANY}) -> ({ANY}, {ANY})"
            )
            forall = grown
            state.handle = fused
            state.in_forall = True
            # the fused copy computes one consumer tile: its loops shrink to the tile's sizes
            consumer = self.states[self.program.consumers(producer_id)[0]]
            for loop, consumer_loop in enumerate(self.program.fusion_loop_map(producer_id)):
                if consumer_loop >= 0:
                    state.extents[loop] = min(state.extents[loop], consumer.extents[consumer_loop])
                    if consumer_loop in consumer.partial:
                        state.partial.add(loop)

    def interchange(self, op: LinalgOp, state: _OpState, permutation: tuple[int, ...]) -> None:
        if sorted(permutation) != sorted(state.order):
            raise ScheduleError(
                f"op {op.id}: interchange {list(permutation)} must permute loops {sorted(state.order)}"
            )
        vector = [state.order.index(p) for p in permutation]
        if not state.generalized:
            generic = self.fresh("g")
            self.emit(
                f"{generic} = transform.structured.generalize {state.handle} : ({ANY}) -> {ANY}"
            )
            state.handle = generic
            state.generalized = True
        swapped = self.fresh("i")
        self.emit(
            f"{swapped} = transform.structured.interchange {state.handle}"
            f" iterator_interchange = {vector} : ({ANY}) -> {ANY}"
        )
        state.handle = swapped
        state.order = list(permutation)
        # generalizing drops the op's tag; put it back, so that its copies can be found
        tag = self.fresh("tag")
        self.emit(f"{tag} = transform.param.constant {op.id} : i64 -> !transform.param<i64>")
        self.emit(
            f'transform.annotate {swapped} "{OP_ID_ATTR}" = {tag} : {ANY}, !transform.param<i64>'
        )

    def decompose(self, op: LinalgOp, state: _OpState) -> None:
        pairs = [(o, w) for o, w in window_loops(op) if o in state.order and w in state.order]
        unit = [(o, w) for o, w in pairs if state.extents[o] == 1 and state.extents[w] == 1]
        if state.generalized or not unit:
            raise ScheduleError(
                f"op {op.id}: decompose needs a named conv/pooling op with an output row and its"
                " window row tiled to 1"
            )
        out_loop, window_loop = unit[0]
        decomposed = self.fresh("d")
        self.emit(
            f"{decomposed} = transform.structured.decompose {state.handle} : ({ANY}) -> {ANY}"
        )
        state.handle = decomposed
        state.order = [i for i in state.order if i not in (out_loop, window_loop)]

    def vectorize(self, op: LinalgOp, state: _OpState) -> None:
        if op.kind == "contraction" and len(op.inputs) > 2:
            # a product of three or more tensors: MLIR's reduction_to_contract aborts on it
            # (an assertion in its cast to VectorType), so the function's cleanup goes
            # without it and such reductions lower as multi-reductions
            self.contract = False
        if state.partial & set(state.order):  # dynamic shapes: masked, at the full tile's size
            sizes = [state.extents[i] for i in state.order]
            self.emit(f"transform.structured.vectorize {state.handle} vector_sizes {sizes} : {ANY}")
        else:
            self.emit(f"transform.structured.vectorize {state.handle} : {ANY}")
        self.vectorized = True

    def _shrink(self, state: _OpState, sizes: tuple[int, ...], forall: bool = False) -> None:
        for i in state.order:
            if sizes[i] and sizes[i] < state.extents[i]:
                if forall and state.extents[i] % sizes[i]:
                    state.partial.add(i)  # a forall's last chunk: not peeled, so masked
                state.extents[i] = sizes[i]

    def apply(self, schedule: Schedule) -> str:
        known = {op.id: op for op in self.program.ops}
        for op_schedule in schedule.ops:
            if op_schedule.op not in known:
                raise ScheduleError(
                    f"schedule names op {op_schedule.op}; program has {sorted(known)}"
                )
            op, state = known[op_schedule.op], self.states[op_schedule.op]
            for step in op_schedule.transforms:
                if step.kind not in (TILE, PACK):  # `pack` hoists out of the last tiling only
                    state.last_loops = 0
                if step.kind == TILE:
                    self.tile(op, state, step.sizes)
                elif step.kind in (TILE_PARALLEL, TILE_FUSE):
                    forall = self.tile_forall(op, state, step.sizes, step.kind)
                    if step.kind == TILE_FUSE:
                        self.fuse_producers(op, forall)
                elif step.kind == INTERCHANGE:
                    self.interchange(op, state, step.permutation)
                elif step.kind == DECOMPOSE:
                    self.peel(op, state)
                    self.decompose(op, state)
                elif step.kind == PACK:
                    self.pack(op, state)
                elif step.kind == VECTORIZE:
                    self.peel(op, state)
                    self.vectorize(op, state)
            self.peel(op, state)
        if self.vectorized:
            func = self.match_func()
            for line in _vector_cleanup(func, self.contract):
                self.emit(line)
        # innermost loops first, so invariant transfers bubble out as far as they can
        for loop in reversed(self.loops_in_order):
            self.emit(f"transform.loop.hoist_loop_invariant_subsets {loop} : {ANY}")
        body = "\n".join(self.lines)
        return (
            "module attributes {transform.with_named_sequence} {\n"
            f"  transform.named_sequence @__transform_main(%root: {ANY} {{transform.readonly}}) {{\n"
            f"{body}\n    transform.yield\n  }}\n}}\n"
        )


def transform_script(program: Program, schedule: Schedule) -> str:
    """The Transform-dialect module that applies `schedule` to `program`'s kernel."""
    return _Builder(program).apply(schedule)
