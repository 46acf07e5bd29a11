"""A machine's profile: the few facts of a CPU that the surrogate reads as inputs.

Vector width, cores, cache sizes, one core's FMA peak (`peak.py`) and one thread's streaming
bandwidth (`bandwidth.py`). With the profile as an input, one surrogate serves many machines:
a new machine is a new input, not a new model.

A machine gets the same profile every time, so that its features never move:

- profiles of known machines ship in `data/machines.json` (`known_profiles`), some of them
  from recorded facts rather than measured (`measured` false; `sources` says where each
  figure comes from);
- this machine, when not among them, is measured once, quietly (`measure_quietly`: each
  figure the best of repeats that agree, or refused), and its profile cached in the user's
  cache folder (`machine/<machine id>-m<PROFILE_METHOD>.json` in `mlirrl_jax.shipped.user_cache_dir`, under
  $MLIRRL_HOME when it is set; or in $MLIRRL_JAX_MACHINE_CACHE), written whole or not at all;
- a measurement store records the profile of each machine whose rows it holds, and a Parquet
  export carries them (`mlirrl_jax.store`).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlirrl_jax.errors import Error
from mlirrl_jax.measure.fingerprint import machine_fingerprint, vector_lanes
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.shipped import KNOWN_MACHINES, user_cache_dir

CACHE_ENV = "MLIRRL_JAX_MACHINE_CACHE"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# A profile's figures are the best of repeated measurements that agree: other work on the
# machine only ever slows a measurement, and its load at the first measurement would otherwise
# stay in the cached profile (one machine's bandwidth was cached once at 28.9 GB/s, once at 16.8)
PROFILE_REPEATS = 3  # measurements of each figure per attempt
PROFILE_TOLERANCE = 0.10  # how far below the best of them the worst may lie
PROFILE_ATTEMPTS = 3  # attempts before the machine is called too busy to be measured
# How a measured profile is measured; a cached profile of another method is measured again.
# 2: the FMA peak's chains fit the vector registers (16 chains spilled on AVX2, halving it)
PROFILE_METHOD = 2


class UnknownMachineError(Error, ValueError):
    """A machine whose profile is neither recorded, shipped, nor this machine's."""


class NoisyMachineError(Error, RuntimeError):
    """This machine's profile could not be measured quietly: other work was running."""


@dataclass(frozen=True)
class MachineProfile:
    """What the surrogate knows of a machine."""

    machine_id: str
    vector_lanes: int  # f32 lanes of one vector register
    cores: int
    l1d_bytes: int  # per core
    l2_bytes: int  # per core
    l3_bytes: int  # shared (0: none)
    fma_peak_gflops: float  # one core, f32 (`peak.fma_peak_gflops`)
    bandwidth_gbs: float  # one thread streaming from memory (`bandwidth.stream_bandwidth_gbs`)
    measured: bool  # both figures measured on the machine by this code
    sources: dict[str, str] = field(default_factory=dict, hash=False)  # figure -> its origin

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> MachineProfile:
        return cls(
            machine_id=str(data["machine_id"]),
            vector_lanes=int(data["vector_lanes"]),
            cores=int(data["cores"]),
            l1d_bytes=int(data["l1d_bytes"]),
            l2_bytes=int(data["l2_bytes"]),
            l3_bytes=int(data["l3_bytes"]),
            fma_peak_gflops=float(data["fma_peak_gflops"]),
            bandwidth_gbs=float(data["bandwidth_gbs"]),
            measured=bool(data["measured"]),
            sources=dict(data.get("sources") or {}),
        )


def cache_bytes(size: str) -> int:
    """Bytes of a cache size as sysfs writes it ("32K", "1024K", "32M"); 0 for none."""
    size = size.strip().upper()
    if not size:
        return 0
    unit = size[-1] if size[-1] in _UNITS else ""
    return int(float(size[: len(size) - len(unit)]) * _UNITS[unit])


def profile_from_fingerprint(
    machine: dict, fma_peak_gflops: float, bandwidth_gbs: float, measured: bool, sources: dict
) -> MachineProfile:
    """A profile of the machine a fingerprint (`machine_fingerprint()`) describes, with its two
    figures."""
    caches = machine.get("caches") or {}
    return MachineProfile(
        machine_id=machine["machine_id"],
        vector_lanes=vector_lanes(machine=machine),
        cores=int(machine["cores"]),
        l1d_bytes=cache_bytes(caches.get("L1d", "")),
        l2_bytes=cache_bytes(caches.get("L2", "")),
        l3_bytes=cache_bytes(caches.get("L3", "")),
        fma_peak_gflops=float(fma_peak_gflops),
        bandwidth_gbs=float(bandwidth_gbs),
        measured=measured,
        sources=sources,
    )


def spread(samples: Sequence[float]) -> float:
    """How far the lowest of repeated measurements lies below the highest, as a share of it."""
    return 1 - min(samples) / max(samples)


def quiet_best(samples: Sequence[float], tolerance: float = PROFILE_TOLERANCE) -> float | None:
    """The best (highest) of repeated measurements of a figure; None where they disagree by
    more than `tolerance` of it: the machine was busy, and the best may be slowed too."""
    return max(samples) if spread(samples) <= tolerance else None


def measure_quietly(measure: Callable[[], float], figure: str, unit: str) -> float:
    """`measure()` taken `PROFILE_REPEATS` times, again while they disagree (`quiet_best`), at
    most `PROFILE_ATTEMPTS` times; a NoisyMachineError naming the spreads after that."""
    spreads = []
    for _ in range(PROFILE_ATTEMPTS):
        samples = [measure() for _ in range(PROFILE_REPEATS)]
        best = quiet_best(samples)
        if best is not None:
            return best
        spreads.append(f"{spread(samples):.0%} ({min(samples):.3g} to {max(samples):.3g})")
    raise NoisyMachineError(
        f"this machine's profile was not measured: its {figure} in {unit} varied by "
        f"{', '.join(spreads)} over {PROFILE_REPEATS} measurements, {PROFILE_ATTEMPTS} times "
        f"(at most {PROFILE_TOLERANCE:.0%} allowed): other work is running here. Rerun on a "
        f"quiet machine; the profile is measured once and kept in {cache_folder()}"
    )


def measure_profile() -> MachineProfile:
    """This machine's profile, its FMA peak and bandwidth measured now, quietly
    (`measure_quietly`: ten seconds or more)."""
    from mlirrl_jax.measure.bandwidth import BUFFER_MIB, stream_bandwidth_gbs
    from mlirrl_jax.measure.peak import fma_peak_gflops

    day = time.strftime("%Y-%m-%d", time.gmtime())
    quietly = f"the best of {PROFILE_REPEATS} within {PROFILE_TOLERANCE:.0%} of each other"
    return profile_from_fingerprint(
        machine_fingerprint(),
        measure_quietly(fma_peak_gflops, "FMA peak", "GFLOP/s"),
        measure_quietly(stream_bandwidth_gbs, "one-thread bandwidth", "GB/s"),
        measured=True,
        sources={
            "fma_peak_gflops": f"measured {day} by measure/peak.py fma_peak_gflops, {quietly}",
            "bandwidth_gbs": f"measured {day} by measure/bandwidth.py stream_bandwidth_gbs "
            f"({BUFFER_MIB} MiB copy, one thread), {quietly}",
            "caches": "the machine fingerprint (sysfs)",
        },
    )


@functools.cache
def known_profiles() -> dict[str, MachineProfile]:
    """The profiles shipped in `data/machines.json`, by machine id."""
    if not KNOWN_MACHINES.is_file():
        return {}
    listed = json.loads(KNOWN_MACHINES.read_text())["machines"]
    return {p["machine_id"]: MachineProfile.from_json(p) for p in listed}


def cache_folder() -> Path:
    """Where measured profiles of this machine are kept: $MLIRRL_JAX_MACHINE_CACHE, else
    `machine` in the user's cache folder (`user_cache_dir`)."""
    chosen = os.environ.get(CACHE_ENV)
    return Path(chosen) if chosen else user_cache_dir() / "machine"


def cached_profile_path() -> Path:
    """The file holding this machine's measured profile, by the method that measures it."""
    return cache_folder() / f"{machine_fingerprint()['machine_id']}-m{PROFILE_METHOD}.json"


def measured_profile(measure: bool = True) -> MachineProfile | None:
    """This machine's measured profile from the cache; measured and cached first if missing
    (None instead when not `measure`)."""
    path = cached_profile_path()
    if path.is_file():
        try:
            return MachineProfile.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):  # a damaged cache is measured again
            pass
    if not measure:
        return None
    profile = measure_profile()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(profile.to_json(), indent=1))
    return profile


def this_machine_profile(measure: bool = True) -> MachineProfile | None:
    """This machine's profile: the shipped one if it is a known machine, else the cached
    measurement (`measured_profile`)."""
    shipped = known_profiles().get(machine_fingerprint()["machine_id"])
    return shipped if shipped is not None else measured_profile(measure)


def profile_of(
    machine_id: str, recorded: dict[str, MachineProfile] | None = None
) -> MachineProfile:
    """The profile of a machine by id: as `recorded` (a store's record), else shipped, else
    this machine's; an unknown machine raises UnknownMachineError."""
    if recorded and machine_id in recorded:
        return recorded[machine_id]
    if machine_id in known_profiles():
        return known_profiles()[machine_id]
    if machine_id == machine_fingerprint()["machine_id"]:
        return this_machine_profile()
    raise UnknownMachineError(
        f"no profile of machine {machine_id}: it is not recorded in the store, not among the "
        f"known machines ({KNOWN_MACHINES}), and not this machine. On that machine, "
        "`mlirrl_jax.measure.profile.this_machine_profile()` measures it; add it to "
        f"{KNOWN_MACHINES.name} or record it in the store (`MeasurementStore.record_machine`)"
    )
