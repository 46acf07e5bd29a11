"""Host devices: a batch sharded over CPU devices gives the same predictions as one device."""

import subprocess
import sys
import textwrap

import pytest

from mlirrl_jax.host_devices import available_cores, shard_rows, use_host_devices

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from mlirrl_jax.host_devices import replicate, shard_rows, use_host_devices
    assert use_host_devices(2) == 2
    import jax
    import jax.numpy as jnp
    from mlirrl_jax.surrogate.api import CostModel
    from mlirrl_jax.surrogate.model import ModelConfig, build
    from mlirrl_jax.env.state import initial_state
    from mlirrl_jax.env.table import encode_programs
    from mlirrl_jax.programs import suites
    from mlirrl_jax.programs.ir import load_program

    programs = [load_program(e.uri) for e in suites.split("dl-v0", "train")[:12]]
    table = encode_programs(programs)
    ids = jnp.arange(64) % len(programs)
    states = jax.vmap(lambda i: initial_state(table, i, jax.random.PRNGKey(0)))(ids)
    model = CostModel(*build(ModelConfig()), {})
    one = np.asarray(jax.jit(model.predict)(table, states))
    sharded = shard_rows(states)
    assert len(sharded.program.sharding.device_set) == 2
    both = np.asarray(jax.jit(model.predict)(replicate(table), sharded))
    assert np.allclose(one, both, atol=1e-5), np.abs(one - both).max()
    chunked = np.asarray(model.predictor(chunk=16)(replicate(table), sharded))
    assert np.allclose(one, chunked, atol=1e-5), np.abs(one - chunked).max()
    try:
        model.predictor(chunk=16)(table, jax.tree.map(lambda a: a[:48], states))
    except ValueError as err:
        assert "multiples of 32" in str(err)
    else:
        raise AssertionError("rows that are not whole chunks per device were accepted")
    try:
        shard_rows(jax.tree.map(lambda a: a[:63], states))
    except ValueError as err:
        assert "do not split evenly" in str(err)
    else:
        raise AssertionError("uneven rows were accepted")
    print("ok")
    """
)


def test_a_batch_sharded_over_two_host_devices_predicts_as_one_device():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_the_device_count_cannot_change_once_jax_runs(monkeypatch):
    import os

    import jax

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")  # restored afterwards

    jax.numpy.zeros(1).block_until_ready()  # this process already computed
    count = jax.local_device_count()
    with pytest.raises(RuntimeError, match="before the first JAX computation"):
        use_host_devices(count + 1)
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"  # left as it was
    assert use_host_devices(count) == count  # the same count is fine
    assert available_cores() >= 1


def test_rows_must_split_evenly():
    import jax
    import jax.numpy as jnp

    with pytest.raises(ValueError, match="do not split evenly"):
        shard_rows({"x": jnp.zeros(3)}, devices=jax.devices() * 2)
