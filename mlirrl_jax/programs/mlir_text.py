"""Building blocks of the benchmark programs' MLIR text: types, the function, filled tensors,
named Linalg ops and `linalg.generic` (`generate` assembles the programs from them)."""

from __future__ import annotations

from collections.abc import Sequence

from mlirrl_jax.programs.specs import NEG_INF, Shape


def tensor_type(shape: Sequence[int]) -> str:
    return f"tensor<{'x'.join(map(str, shape))}xf32>"


def func(
    name: str, args: Sequence[tuple[str, Shape]], body: Sequence[str], res: str, res_shape: Shape
) -> str:
    sig = ", ".join(f"%{a}: {tensor_type(s)}" for a, s in args)
    lines = [f"func.func @{name}({sig}) -> {tensor_type(res_shape)} {{"]
    lines += [f"  {line}" for line in body]
    lines += [f"  return %{res} : {tensor_type(res_shape)}", "}", ""]
    return "\n".join(lines)


def empty(res: str, shape: Shape) -> str:
    return f"%{res} = tensor.empty() : {tensor_type(shape)}"


def filled(res: str, value: str, shape: Shape) -> list[str]:
    """A tensor.empty filled with the f32 scalar `%value`."""
    return [
        empty(f"{res}_e", shape),
        f"%{res} = linalg.fill ins(%{value} : f32) outs(%{res}_e : {tensor_type(shape)}) -> {tensor_type(shape)}",
    ]


def named(
    res: str, op: str, ins: Sequence[tuple[str, Shape]], out: tuple[str, Shape], attrs: str = ""
) -> str:
    names = ", ".join(f"%{n}" for n, _ in ins)
    types = ", ".join(tensor_type(s) for _, s in ins)
    attr = f" {{{attrs}}}" if attrs else ""
    return (
        f"%{res} = {op}{attr} ins({names} : {types}) "
        f"outs(%{out[0]} : {tensor_type(out[1])}) -> {tensor_type(out[1])}"
    )


def window_attrs(stride: int, dilation: int) -> str:
    return (
        f"dilations = dense<{dilation}> : tensor<2xi64>, strides = dense<{stride}> : tensor<2xi64>"
    )


def generic(
    res: str,
    dims: Sequence[str],
    iters: Sequence[str],
    ins: Sequence[tuple[str, Shape, str]],
    out: tuple[str, Shape, str],
    body: Sequence[str],
    result: str,
) -> list[str]:
    """A linalg.generic; each operand is (value, shape, comma-separated index expressions)."""
    d = ", ".join(dims)
    maps = ", ".join(f"affine_map<({d}) -> ({e})>" for _, _, e in [*ins, out])
    it = ", ".join(f'"{i}"' for i in iters)
    names = ", ".join(f"%{n}" for n, _, _ in ins)
    types = ", ".join(tensor_type(s) for _, s, _ in ins)
    bb = ", ".join([f"%in{i}: f32" for i in range(len(ins))] + ["%acc: f32"])
    return [
        f"%{res} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{it}]}}",
        f"    ins({names} : {types}) outs(%{out[0]} : {tensor_type(out[1])}) {{",
        f"  ^bb0({bb}):",
        *(f"    {line}" for line in body),
        f"    linalg.yield %{result} : f32",
        f"  }} -> {tensor_type(out[1])}",
    ]


def ids(rank: int) -> tuple[list[str], str]:
    dims = [f"d{i}" for i in range(rank)]
    return dims, ", ".join(dims)


ZERO = "%zero = arith.constant 0.0 : f32"
NEG_INF_CONSTANT = f"%ninf = arith.constant {NEG_INF} : f32"
