"""This machine's profile measured quietly (the best of repeats that agree, or refused), and
the caches kept under $MLIRRL_HOME when it is set."""

import itertools

import pytest

from mlirrl_jax.host_devices import compilation_cache_folder
from mlirrl_jax.measure import profile, refcache
from mlirrl_jax.measure.profile import (
    PROFILE_ATTEMPTS,
    PROFILE_REPEATS,
    NoisyMachineError,
    measure_quietly,
    quiet_best,
    spread,
)

# one machine's bandwidth in GB/s, measured while it was busy and while it was quiet
BUSY = [28.85, 16.75, 27.9]
QUIET = [31.2, 31.87, 30.9]


def test_a_profile_figure_is_the_best_of_repeats_that_agree():
    assert quiet_best(QUIET) == 31.87
    assert spread(BUSY) == pytest.approx(1 - 16.75 / 28.85)
    assert quiet_best(BUSY) is None  # the best of a busy machine's may be slowed too
    assert quiet_best([100.0, 91.0]) == 100.0 and quiet_best([100.0, 89.0]) is None


def test_a_noisy_figure_is_measured_again_then_refused_naming_its_spread():
    # fault injection: the measurements of a busy machine, in turn, instead of real ones
    busy = itertools.cycle(BUSY)
    taken = []

    def measure() -> float:
        taken.append(next(busy))
        return taken[-1]

    with pytest.raises(NoisyMachineError) as refused:
        measure_quietly(measure, "one-thread bandwidth", "GB/s")
    message = str(refused.value)
    assert len(taken) == PROFILE_REPEATS * PROFILE_ATTEMPTS
    assert "one-thread bandwidth in GB/s varied by 42% (16.8 to 28.9)" in message
    assert "quiet machine" in message and str(profile.cache_folder()) in message
    # busy at first, then quiet: measured again, and the quiet attempt's best kept
    readings = iter([*itertools.islice(itertools.cycle(BUSY), PROFILE_REPEATS), *QUIET * 3])
    assert measure_quietly(lambda: next(readings), "bandwidth", "GB/s") == max(QUIET)


def test_the_caches_live_under_mlirrl_home_when_it_is_set(tmp_path, monkeypatch):
    for variable in (profile.CACHE_ENV, refcache.CACHE_ENV, "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for home, caches in [("", tmp_path / "xdg" / "mlirrl-jax"), (tmp_path, tmp_path / "cache")]:
        monkeypatch.setenv("MLIRRL_HOME", str(home))
        assert profile.cache_folder() == caches / "machine"
        assert refcache.default_folder() == caches / "reference"
        assert compilation_cache_folder() == str((caches / "xla").resolve())


def test_the_store_and_adapted_agents_follow_mlirrl_home_as_it_is_at_the_call(
    tmp_path, monkeypatch
):
    from mlirrl_jax.collect import CollectConfig
    from mlirrl_jax.regrounding import RegroundConfig
    from mlirrl_jax.shipped import adapted_dir, default_store

    for home in (tmp_path / "one", tmp_path / "two"):
        monkeypatch.setenv("MLIRRL_HOME", str(home))
        assert default_store() == str(home / "measurements.db")
        assert adapted_dir() == home / "adapted"
        assert RegroundConfig().store == default_store()
        assert CollectConfig().store == home / "measurements.db"
