"""A model's Linalg-on-tensors module cut into programs `load_program` accepts.

Each Linalg op of the model's function becomes a program with the ops that make its output
buffer (a `linalg.fill` of a `tensor.empty`), the scalar constants it reads, and the
element-wise ops that consume its result alone after it (a producer-consumer group, as long as
the environment's tables hold it; else the group is cut back to the op alone). Every other
tensor it reads (an activation, a weight) becomes an argument of the program. Programs with the
same text are one layer shape, counted.

What is not a Linalg op is not a program: views (`tensor.expand_shape`, `collapse_shape`,
`cast`) cost nothing, data movement (`tensor.pad`, slices, concatenation) is named in the report
and left out of the composed time, and anything else is named with the reason. A program
`load_program` refuses is named with its error; one beyond the environment's limits is kept,
to be timed unscheduled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from mlir import ir
from mlir.dialects import func as func_d

from mlirrl_jax.errors import Error
from mlirrl_jax.models.rewrite import (
    STRIDED_FORMS,
    default_min_row,
    gather_strided_convolutions,
    is_gather,
)
from mlirrl_jax.models.steps import Step
from mlirrl_jax.programs.ir import Program, ProgramError, parse_program
from mlirrl_jax.records import Record

VIEWS = {"tensor.expand_shape", "tensor.collapse_shape", "tensor.cast", "tensor.bitcast"}
MOVES = {
    "tensor.pad",
    "tensor.extract_slice",
    "tensor.insert_slice",
    "tensor.concat",
    "tensor.extract",
    "tensor.insert",
    "tensor.reshape",
}
INIT = {"tensor.empty", "linalg.fill", "arith.constant"}
MAX_GROUP = 4  # Linalg ops of one producer-consumer group, the fill not counted


class ModelError(Error, ValueError):
    """A model that cannot be imported; the message says why."""


@dataclass
class Layer(Record):
    """One distinct layer shape of a model: its program, or why there is none."""

    name: str
    ops: list[str]  # the Linalg ops of its program (a fill not counted)
    count: int = 1  # times the model computes this shape
    status: str = "program"  # "program", "unscheduled" (beyond the environment), "refused"
    reason: str | None = None
    flops: int | None = None
    program_hash: str | None = None
    path: str | None = None  # its .mlir, relative to the import's folder
    # a strided convolution cut as a gather and a contraction (`models.rewrite`): the same
    # layer cut as it was, for XLA's baseline, which takes the convolution itself
    direct_path: str | None = None


@dataclass
class Cut:
    """What cutting a module gives: the layers with their texts, and what was left out."""

    layers: list[Layer] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)  # layer name -> MLIR text
    programs: dict[str, Program] = field(default_factory=dict)  # layer name -> Program
    left_out: dict[str, int] = field(default_factory=dict)  # op name -> count (moves, others)
    views: int = 0
    dropped_asserts: int = 0
    gathered: int = 0  # strided convolutions cut as a gather and a contraction
    # the function as steps in order (layers, constants, views, moves), for `models.execute`
    steps: list[Step] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    input_shapes: list[list[int]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    literals: dict[str, np.ndarray] = field(default_factory=dict)  # large literal constants' bytes


def _is_elementwise(op) -> bool:
    if op.operation.name != "linalg.generic":
        return op.operation.name in {"linalg.add", "linalg.mul", "linalg.sub", "linalg.max"}
    iterators = str(op.attributes["iterator_types"])
    return "reduction" not in iterators


def _producer(value: ir.Value):
    owner = value.owner
    return owner if isinstance(owner, ir.Operation | ir.OpView) else None


def _init_chain(op) -> list:
    """The ops that make `op`'s output buffers from nothing: fills of empties, empties."""
    chain = []
    outs = op.operation.operands[len(op.operation.operands) - len(op.operation.results) :]
    for value in outs:
        owner = _producer(value)
        if owner is None:
            continue
        name = owner.operation.name
        if name == "tensor.empty":
            chain.append(owner.operation)
        elif name == "linalg.fill":
            inner = _producer(owner.operation.operands[1])
            if inner is not None and inner.operation.name == "tensor.empty":
                chain += [inner.operation, owner.operation]
    return chain


def _uses(value: ir.Value) -> list:
    return [use.owner for use in value.uses]


def _group(op, max_ops: int, taken: set) -> list:
    """`op` and the element-wise ops after it that alone consume the one before (and are in
    no group of `taken` yet)."""
    group = [op.operation]
    while len(group) < max_ops and len(group[-1].results) == 1:
        users = _uses(group[-1].results[0])
        if len(users) != 1:
            break
        user = users[0]
        name = user.operation.name if hasattr(user, "operation") else ""
        if not name.startswith("linalg.") or name == "linalg.fill" or not _is_elementwise(user):
            break
        if _gathered_into(user) is not None:  # a gather goes with the op it feeds
            break
        if user.operation in taken:
            break
        group.append(user.operation)
    return group


def _gathered_into(op):
    """The reduction op a gather (`models.rewrite`) alone feeds, else None."""
    if not is_gather(op) or len(op.results) != 1:
        return None
    users = _uses(op.results[0])
    if len(users) != 1:
        return None
    user = users[0]
    if user.operation.name != "linalg.generic" or _is_elementwise(user):
        return None
    return user


SCALAR_CONSTANTS = {"arith.constant", "complex.constant"}


def _scalar_constants(ops: list) -> list:
    """The scalar constants the ops (and their regions) read from outside."""
    found, inside = [], set()

    def visit(o):
        for v in o.operands:
            owner = _producer(v)
            if (
                owner is not None
                and owner.operation.name in SCALAR_CONSTANTS
                and not isinstance(v.type, ir.RankedTensorType)
                and owner.operation not in found
            ):
                found.append(owner.operation)
        inside.add(o)
        return ir.WalkResult.ADVANCE

    for o in ops:
        o.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def program_text(ops: list, name: str = "layer") -> tuple[str, list]:
    """One public function computing `ops` (in order; the last one's results returned), every
    tensor they read from outside as an argument; with those arguments, in order."""
    members = set(ops)
    arguments: list[ir.Value] = []

    def outside(v: ir.Value) -> bool:
        owner = _producer(v)
        return owner is None or owner.operation not in members

    for o in ops:
        for v in o.operands:
            if isinstance(v.type, ir.RankedTensorType) and outside(v) and v not in arguments:
                arguments.append(v)
    results = [r.type for r in ops[-1].results]
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func_d.FuncOp(name, ([a.type for a in arguments], results))
        entry = fn.add_entry_block()
    mapping = dict(zip(arguments, entry.arguments, strict=True))
    with ir.InsertionPoint(entry):
        for o in ops:
            copy = o.clone()

            def remap(inner):
                for old, new in mapping.items():
                    inner.replace_uses_of_with(old, new)
                return ir.WalkResult.ADVANCE

            copy.walk(remap, ir.WalkOrder.PRE_ORDER)
            mapping.update(zip(o.results, copy.results, strict=True))
        func_d.ReturnOp([mapping[r] for r in ops[-1].results])
    return str(module), arguments


def _within_limits(program: Program) -> str | None:
    """None if the environment's tables hold the program, else why not."""
    from mlirrl_jax.env.state import EncodingError
    from mlirrl_jax.env.table import encode_programs

    try:
        encode_programs([program])
    except EncodingError as exc:
        return str(exc)
    return None


def _strip_asserts(module) -> int:
    """Erase `cf.assert`s (torch-mlir's run-time checks, e.g. of a division by zero in a
    batch-norm's folding); they compute no value. Returns how many."""
    found = []

    def visit(o):
        if o.name == "cf.assert":
            found.append(o)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.POST_ORDER)
    for o in found:
        o.erase()
    return len(found)


def _ints(attr) -> list[int]:
    return [int(x) for x in ir.DenseI64ArrayAttr(attr)]


def _shape(value) -> list[int]:
    """A value's shape; a ModelError naming it where it is not a tensor of fixed shape."""
    if isinstance(value.type, ir.RankedTensorType) and value.type.has_static_shape:
        return list(value.type.shape)
    owner = _producer(value)
    made = f"{owner.operation.name} gives" if owner is not None else "the model takes"
    raise ModelError(
        f"{made} {value.get_name()} of type {value.type}: only tensors of fixed shape can pass "
        "between layers (a size computed from the data, as torch.nonzero's, cannot be cut)"
    )


LITERAL_IN_STEPS = 16  # a literal with more elements goes to the weights (`Cut.literals`)


def _constant_step(op, name: str, cut: Cut) -> Step:
    """A tensor constant: a weight (`dense_resource`, read from the model's weights) or a
    literal (kept in the step when small, else with the weights under a name of its own)."""
    attr = op.attributes["value"]
    step = Step("constant", result=name, shape=_shape(op.results[0]))
    step.dtype = str(ir.RankedTensorType(op.results[0].type).element_type)
    text = str(attr)
    if text.startswith("dense_resource<"):
        step.resource = text[len("dense_resource<") :].split(">", 1)[0]
    else:
        values = np.array(ir.DenseElementsAttr(attr))
        if values.size <= LITERAL_IN_STEPS:
            step.values = values.reshape(-1).tolist()
        else:
            step.resource = f"literal_{len(cut.literals)}"
            cut.literals[step.resource] = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    return step


def _pad_value(op) -> float:
    yielded = op.regions[0].blocks[0].operations[0]
    owner = _producer(yielded.operands[0])
    if owner is None or owner.operation.name != "arith.constant":
        raise ModelError("a tensor.pad whose padding value is not a constant")
    return float(ir.FloatAttr(owner.operation.attributes["value"]).value)


def _other_step(op, names) -> Step:
    """A step that is not a Linalg op: what the executor needs to compute it."""
    name = op.operation.name
    step = Step(
        name,
        operands=[names(v) for v in op.operands if isinstance(v.type, ir.RankedTensorType)],
        result=names(op.results[0]) if len(op.results) else None,
    )
    if len(op.results):
        step.shape = _shape(op.results[0])
    attrs = op.operation.attributes
    if name == "tensor.pad":
        step.low, step.high = _ints(attrs["static_low"]), _ints(attrs["static_high"])
        step.value = _pad_value(op)
    elif name in {"tensor.extract_slice", "tensor.insert_slice"}:
        step.offsets = _ints(attrs["static_offsets"])
        step.sizes = _ints(attrs["static_sizes"])
        step.strides = _ints(attrs["static_strides"])
    elif name == "tensor.concat":
        step.dim = int(ir.IntegerAttr(attrs["dim"]).value)
    return step


def cut_module(
    text: str, max_group: int = MAX_GROUP, strided: str = "im2col", min_row: int | None = None
) -> Cut:
    """Cut a model's Linalg-on-tensors text into layers (see the module's documentation).
    `strided`: "im2col" rewrites strided convolutions whose output rows hold `min_row`
    elements or more (default `rewrite.default_min_row()`) as a gather and a contraction first
    (`models.rewrite`), "direct" keeps them as they are."""
    if strided not in STRIDED_FORMS:
        raise ModelError(f"strided convolutions as {strided!r}: expected one of {STRIDED_FORMS}")
    cut = Cut()
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context, ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except Exception as exc:  # the bindings raise MLIRError with the diagnostics
            raise ModelError(
                f"the lowered model does not parse: {' '.join(str(exc).split())[:400]}"
            ) from None
        funcs = [
            op
            for op in module.body.operations
            if op.operation.name == "func.func" and "sym_visibility" not in op.attributes
        ]
        if len(funcs) != 1:
            raise ModelError(
                f"expected one public function in the lowered model, found {len(funcs)}"
            )
        cut.dropped_asserts = _strip_asserts(module)
        if strided == "im2col":
            min_row = default_min_row() if min_row is None else min_row
            cut.gathered = gather_strided_convolutions(module, min_row)
        state = ir.AsmState(funcs[0])
        body = funcs[0].regions[0].blocks[0]
        cut.inputs = [a.get_name(state) for a in body.arguments]
        cut.input_shapes = [_shape(a) for a in body.arguments]
        grouped: set = set()
        by_text: dict[str, Layer] = {}
        beyond: dict[str, str | None] = {}  # a group's text -> why the tables cannot hold it
        position = {op.operation: i for i, op in enumerate(body.operations)}
        ends_at: dict[int, int] = {}  # step -> the position it belongs at, for layers
        for op in body.operations:
            name = op.operation.name
            if op.operation in grouped:
                continue
            ends_at.setdefault(len(cut.steps), position[op.operation])
            if name == "func.return":
                cut.outputs = [v.get_name(state) for v in op.operands]
                continue
            if name in SCALAR_CONSTANTS:
                if isinstance(op.results[0].type, ir.RankedTensorType):
                    cut.steps.append(_constant_step(op, op.results[0].get_name(state), cut))
                continue
            if name in INIT:  # made again inside each program that reads it
                cut.steps.append(_other_step(op, lambda v: v.get_name(state)))
                if name == "linalg.fill":
                    cut.steps[-1].value = _fill_value(op)
                continue
            if name in VIEWS:
                cut.views += 1
                cut.steps.append(_other_step(op, lambda v: v.get_name(state)))
                continue
            if not name.startswith("linalg."):
                cut.left_out[name] = cut.left_out.get(name, 0) + 1
                cut.steps.append(_other_step(op, lambda v: v.get_name(state)))
                continue
            group = _group(op, max_group, grouped)
            keep = 1
            fed = _gathered_into(op)
            if fed is not None:  # a gather with the op it feeds (the gather not counted)
                group = [op.operation, *_group(fed, max_group, grouped)]
                keep = 2
            text, args = _program(group, position)
            if len(group) > keep and _beyond(text, beyond) is not None:
                # beyond the environment's tables as a group: the op alone, and the group's
                # other ops layers of their own later (so that each is counted once)
                group = group[:keep]
                text, args = _program(group, position)
            layer = _layer(text, group, by_text, cut)
            grouped.update(group)
            # at the place of its last op: the group's later ops may read values made after
            # its first (a batch-norm's reshaped statistics)
            ends_at[len(cut.steps)] = position[group[-1]]
            cut.steps.append(
                Step(
                    "layer",
                    layer=layer.name,
                    operands=[a.get_name(state) for a in args],
                    result=group[-1].results[0].get_name(state),
                )
            )
    order = sorted(range(len(cut.steps)), key=lambda i: ends_at[i])
    cut.steps = [cut.steps[i] for i in order]
    return cut


def _fill_value(op) -> float:
    owner = _producer(op.operation.operands[0])
    if owner is None or owner.operation.name != "arith.constant":
        raise ModelError("a linalg.fill whose value is not a constant")
    attr = owner.operation.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    return float(ir.FloatAttr(attr).value)


def _program(group: list, position: dict) -> tuple[str, list]:
    """The program computing `group` (with the ops making its buffers and the scalar constants
    it reads) and the values it takes as arguments."""
    ops = [*_init_chain(group[0]), *group]
    for o in group[1:]:
        ops += [c for c in _init_chain(o) if c not in ops]
    ops = sorted(_scalar_constants(ops) + ops, key=position.__getitem__)
    return program_text(ops)


def _beyond(text: str, known: dict[str, str | None]) -> str | None:
    """Why the environment's tables cannot hold the program `text` (None: they can, or it is
    no program the project takes), once per text."""
    if text not in known:
        try:
            known[text] = _within_limits(parse_program(text, "group"))
        except ProgramError:
            known[text] = None
    return known[text]


def _layer(text: str, group: list, by_text: dict, cut: Cut) -> Layer:
    """The layer whose program is `text`, counted once more (made the first time)."""
    if text in by_text:
        by_text[text].count += 1
        return by_text[text]
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    kinds = ["gather" if is_gather(o) else o.name.removeprefix("linalg.") for o in group]
    layer = Layer(name=f"{len(by_text):03d}_{'+'.join(kinds)}_{digest}", ops=kinds)
    by_text[text] = layer
    cut.layers.append(layer)
    cut.texts[layer.name] = text
    try:
        program = parse_program(text, layer.name)
    except ProgramError as exc:
        layer.status, layer.reason = "refused", str(exc)
        return layer
    layer.flops, layer.program_hash = program.flops, program.hash
    cut.programs[layer.name] = program
    beyond = _within_limits(program)
    if beyond is not None:
        layer.status, layer.reason = "unscheduled", f"beyond the environment's tables: {beyond}"
    return layer
