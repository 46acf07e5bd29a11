"""What a Linalg op allows, read from its loops and access maps: its sliding windows
(`window_loops`), whether MLIR can decompose (`decomposable`) or vectorize it as it is
(`vectorizable`), and the inputs `pack` copies into panels (`packable_inputs`). The
environment's table, the heuristic and the Transform-dialect builder all read these."""

from __future__ import annotations

from mlirrl_jax.programs.ir import LinalgOp


def window_loops(op: LinalgOp) -> list[tuple[int, int]]:
    """(output loop, window loop) pairs of a sliding-window op: conv H then W, in operand order."""
    pairs = []
    for operand in op.inputs:
        for row in operand.access:
            nonzero = [i for i, c in enumerate(row) if c]
            if len(nonzero) != 2:
                continue
            kinds = {op.loops[i].iterator: i for i in nonzero}
            if set(kinds) == {"parallel", "reduction"}:
                pairs.append((kinds["parallel"], kinds["reduction"]))
    return pairs


# the named sliding-window ops MLIR's `transform.structured.decompose` turns into 1-D ones (a
# depthwise NCHW convolution has no 1-D form there)
DECOMPOSABLE = frozenset(
    ["linalg.conv_2d_nhwc_hwcf", "linalg.conv_2d_nchw_fchw", "linalg.depthwise_conv_2d_nhwc_hwc"]
    + [f"linalg.pooling_nhwc_{k}" for k in ("sum", "max", "min", "max_unsigned", "min_unsigned")]
    + ["linalg.pooling_nchw_sum", "linalg.pooling_nchw_max"]
)


def decomposable(op: LinalgOp) -> bool:
    """Whether `decompose` can turn the op's 2-D window into a 1-D one (then it vectorizes)."""
    return op.name in DECOMPOSABLE and bool(window_loops(op))


ONE_D_WINDOWS = ("linalg.conv_1d", "linalg.depthwise_conv_1d", "linalg.pooling_n")  # 1-D


def vectorizable(op: LinalgOp) -> bool:
    """Whether MLIR's vectorizer takes the op as it is: every operand read through a projected
    permutation (a dimension one loop with step 1, or a broadcast), or a named 1-D window. A 2-D
    window vectorizes once decomposed (`decomposable`); a depthwise NCHW window or a gather
    through `oh * 2 + kh` (`models.rewrite`) not at all: tiled, it runs as scalar loops."""
    if op.name.startswith(ONE_D_WINDOWS) and len(window_loops(op)) == 1:
        return True
    for operand in op.operands:
        rows = [[i for i, c in enumerate(row) if c] for row in operand.access]
        loops = [i for row in rows for i in row]
        steps = [operand.access[d][row[0]] for d, row in enumerate(rows) if row]
        if any(len(row) > 1 for row in rows) or set(steps) - {1} or len(set(loops)) < len(loops):
            return False
    return True


def single_loops(access) -> list[int] | None:
    """The loop indexing each dimension of an operand, or None if a dimension is not one loop
    (a sliding window, a constant)."""
    loops = []
    for row in access:
        nonzero = [i for i, c in enumerate(row) if c]
        if len(nonzero) != 1 or row[nonzero[0]] != 1:
            return None
        loops.append(nonzero[0])
    return loops


def packable_inputs(op: LinalgOp) -> list[int]:
    """The operands (indices among the op's operands) that `pack` copies into panels: the
    inputs indexed by single loops that the vector lanes walk (they index the loop of the
    output's last dimension) and that another output loop reuses (they do not index it): a
    matmul's B, a convolution's filter. Empty where the op cannot be packed: an output
    indexed otherwise than by single loops, no output loop to reuse a panel across, or no
    reduction (an element-wise op reads each input element once per output element anyway)."""
    if not op.inputs or len(op.outputs) != 1:
        return []
    if not any(loop.iterator == "reduction" for loop in op.loops):
        return []
    out_loops = single_loops(op.outputs[0].access)
    if not out_loops or len(out_loops) < 2:
        return []
    lanes = out_loops[-1]
    packed = []
    for k, operand in enumerate(op.inputs):
        loops = single_loops(operand.access)
        if loops and lanes in loops and any(i not in loops for i in out_loops[:-1]):
            packed.append(k)
    return packed
