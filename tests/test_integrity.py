"""Checksums of saved artifacts (`mlirrl_jax.integrity`): the shipped folders are sealed whole,
and damage to any one file (bytes flipped, cut short, deleted) is one line naming it, through
the public load paths and the CLI, before any slow work. Faults are injected into temporary
copies of the shipped data."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from mlirrl_jax import integrity
from mlirrl_jax.agent import checkpoint
from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.surrogate import load_surrogate
from mlirrl_jax.cli import main
from mlirrl_jax.integrity import IntegrityError
from mlirrl_jax.shipped import (
    SHIPPED_AGENT,
    SHIPPED_SEEDS,
    SHIPPED_SURROGATE,
    SINGLE_MACHINE_SURROGATE,
)
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import CostModel

PROGRAM = "suite://dl-v0/conv2d_nhwc_n1_h226_w226_c3_f64_k3_s1_d1"
FAULTS = ("flip", "truncate", "delete")


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def inject(path: Path, fault: str) -> bytes:
    """Damage `path` by `fault`; returns its bytes, to put back."""
    original = path.read_bytes()
    if fault == "flip":  # random bytes over the middle, xored so that every one changes
        rng = np.random.default_rng(len(original))
        middle, count = len(original) // 2, min(16, len(original))
        noise = rng.integers(1, 256, count, dtype=np.uint8).tobytes()
        start = max(0, min(middle, len(original) - count))
        damaged = bytes(b ^ n for b, n in zip(original[start : start + count], noise))
        path.write_bytes(original[:start] + damaged + original[start + count :])
    elif fault == "truncate":
        path.write_bytes(original[: len(original) // 2])
    else:
        path.unlink()
    return original


def one_error_line(capsys) -> str:
    """The single line `main` printed on stderr, checked to come without a traceback."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture
def shipped_copies(tmp_path, monkeypatch):
    """Copies of data/agent and data/cost_model_multi that stand in for the shipped folders (which
    must carry their manifests): relocated, read by the real load paths."""
    agent = shutil.copytree(SHIPPED_AGENT, tmp_path / "data" / "agent")
    surrogate = shutil.copytree(SHIPPED_SURROGATE, tmp_path / "data" / "cost_model")
    monkeypatch.setattr(integrity, "SHIPPED_FOLDERS", (agent, surrogate))
    # the agent's config names the shipped surrogate (""): its copy here
    monkeypatch.setattr("mlirrl_jax.agent.surrogate.SHIPPED_SURROGATE", surrogate)
    return agent, surrogate


def test_shipped_folders_are_sealed_whole():
    for folder in (SHIPPED_AGENT, SHIPPED_SURROGATE, SINGLE_MACHINE_SURROGATE):
        listed = set(integrity.listed(folder))
        every = {p.relative_to(folder).as_posix() for p in files_of(folder)}
        assert listed == every - {integrity.MANIFEST}, f"re-seal {folder}: see integrity.py"
        assert integrity.verify(folder, "-")
    seeds = sorted(SHIPPED_SEEDS.glob("*.parquet"))
    assert seeds and all(integrity.verify_file(p, "-") for p in seeds)


def test_verifying_the_shipped_agent_is_cheap():
    started = time.perf_counter()
    assert integrity.verify(SHIPPED_AGENT, "-") and integrity.verify(SHIPPED_SURROGATE, "-")
    assert time.perf_counter() - started < 0.5  # about 4 ms on a 2-core machine, warm


def test_every_file_of_the_shipped_agent_is_checked(shipped_copies, capsys):
    agent, _ = shipped_copies
    for path in files_of(agent):
        for i, fault in enumerate(FAULTS):
            original = inject(path, fault)
            with pytest.raises(IntegrityError) as caught:
                Agent.load(agent)
            message = str(caught.value)
            assert message.startswith(f"{path}: ") and "\n" not in message
            assert ("missing" if fault == "delete" else "damaged") in message
            if i == len(FAULTS) - 1 or path.name == integrity.MANIFEST:
                assert main(["show", PROGRAM, "--agent", str(agent)]) == 2
                assert one_error_line(capsys) == f"error: {message}"
            path.write_bytes(original)
    capsys.readouterr()
    assert Agent.load(agent).surrogate.path == str(shipped_copies[1].resolve())  # intact: loads


def test_every_file_of_the_shipped_surrogate_is_checked(shipped_copies, capsys):
    agent, surrogate = shipped_copies
    for n, path in enumerate(files_of(surrogate)):
        for fault in FAULTS:
            original = inject(path, fault)
            for load in (CostModel.load, load_surrogate):
                with pytest.raises(IntegrityError) as caught:
                    load(str(surrogate))
                message = str(caught.value)
                assert message.startswith(f"{path}: ") and "\n" not in message
            if fault == FAULTS[n % len(FAULTS)]:  # through the CLI: the agent's surrogate
                assert main(["show", PROGRAM, "--agent", str(agent)]) == 2
                assert one_error_line(capsys) == f"error: {message}"
            path.write_bytes(original)
    assert CostModel.load(surrogate).meta["feature_version"] is not None  # intact: loads


def test_a_cut_short_model_json_is_named(tmp_path):
    """The reported bug: `train --surrogate` on a folder whose model.json is cut short
    printed a JSON parser's error naming nothing; also for a folder saved before manifests."""
    folder = shutil.copytree(SHIPPED_SURROGATE, tmp_path / "surrogate")
    inject(folder / "model.json", "truncate")
    command = [sys.executable, "-m", "mlirrl_jax.cli", "train", "--surrogate", str(folder)]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "run"), "--iterations", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {folder / 'model.json'}: damaged"), lines
    (folder / integrity.MANIFEST).unlink()  # as saved before manifests
    with pytest.raises(IntegrityError, match=r"model\.json: damaged \(not valid JSON"):
        load_surrogate(str(folder))


class TinyState(NamedTuple):
    """What `checkpoint.save` needs of a TrainingState: an iteration, and arrays."""

    iteration: np.ndarray
    weights: np.ndarray


def test_checkpoints_carry_manifests(tmp_path):
    run = tmp_path / "run"
    for step in range(1, checkpoint.KEEP + 2):
        checkpoint.save(
            run, TinyState(np.asarray(step, np.int32), np.arange(4096.0) * step), {"config": {}}
        )
    newest = checkpoint.step_dir(run, checkpoint.KEEP + 1)
    listed = set(integrity.listed(newest))
    assert listed == {p.relative_to(newest).as_posix() for p in files_of(newest)} - {
        integrity.MANIFEST
    }
    # the oldest step went whole, its manifest with it
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "3", "4"]
    like = TinyState(np.asarray(0, np.int32), np.zeros(4096))
    state, meta = checkpoint.restore(run, like)
    assert meta["iteration"] == 4 and state.weights[1] == 4.0
    # a finished run's seal covers its own files, not what other jobs write beside them
    (run / "config.json").write_text("{}")
    (run / "validation.md").write_text("first report")
    checkpoint.seal_run(run)
    assert "config.json" in integrity.listed(run)
    assert "validation.md" not in integrity.listed(run)
    (run / "validation.md").write_text("a second validation rewrites its report")
    assert integrity.verify(run, checkpoint.REDO)
    # a sealed (finished) run loses its seal when it saves again
    checkpoint.save(run, TinyState(np.asarray(5, np.int32), np.arange(4096.0)), {"config": {}})
    assert not (run / integrity.MANIFEST).exists()
    data = max((checkpoint.step_dir(run, 5) / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    inject(data, "flip")
    with pytest.raises(IntegrityError, match=f"^{data}: damaged"):
        checkpoint.restore(run, like)


def test_random_bytes_in_a_checkpoint_are_refused(tmp_path, capsys):
    """The reported bug: `optimize --run` used a checkpoint with random bytes in its data.
    The copy is a run as `checkpoint.save` leaves it: its step sealed, the run not."""
    run = shutil.copytree(SHIPPED_AGENT, tmp_path / "run")
    (run / integrity.MANIFEST).unlink()
    step = checkpoint.step_dir(run, checkpoint.latest_step(run))
    integrity.seal(step)
    data = max((step / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    inject(data, "flip")
    out = tmp_path / "out"
    assert main(["optimize", PROGRAM, "--run", str(run), "--out", str(out)]) == 2
    assert one_error_line(capsys).startswith(f"error: {data}: damaged (its sha256 does not match")
    assert not out.exists()


def test_a_deleted_item_of_an_old_checkpoint_is_named(tmp_path):
    """A checkpoint saved before manifests: orbax's missing item is one line naming the step."""
    from mlirrl_jax.agent.config import AgentConfig
    from mlirrl_jax.agent.networks import abstract

    run = shutil.copytree(SHIPPED_AGENT, tmp_path / "run")
    (run / integrity.MANIFEST).unlink()
    step = checkpoint.step_dir(run, checkpoint.latest_step(run))
    (step / integrity.MANIFEST).unlink(missing_ok=True)  # saved before step manifests too
    meta = checkpoint.load_meta(run)
    shutil.rmtree(step / "state")
    network = AgentConfig.from_json(meta["config"]).network
    with pytest.raises(IntegrityError, match=f'^{step}: unreadable checkpoint \\(Item "state"'):
        checkpoint.restore_params(run, abstract(network)[1], meta)
    shutil.rmtree(step / "meta")
    with pytest.raises(IntegrityError, match=f'^{step}: unreadable checkpoint \\(Item "meta"'):
        Agent.load(run)


def test_a_damaged_manifest_is_named_as_such(tmp_path):
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    manifest = integrity.seal(folder)
    record = json.loads(manifest.read_text())
    record["files"]["a.json"] = "0" * 64  # valid JSON, entries no longer its own
    manifest.write_text(json.dumps(record))
    with pytest.raises(IntegrityError, match=f"^{manifest}: damaged \\(its entries"):
        integrity.verify(folder, "-")
    manifest.unlink()
    assert not integrity.verify(folder, "-")  # saved before manifests: loads unverified


def test_the_seed_parquet_is_checked_on_import(tmp_path, monkeypatch, capsys):
    seed = sorted(SHIPPED_SEEDS.glob("*.parquet"))[0]
    copy = Path(shutil.copy(seed, tmp_path / seed.name))
    sidecar = Path(shutil.copy(integrity.sidecar_of(seed), integrity.sidecar_of(copy)))
    store = tmp_path / "store.db"
    inject(copy, "flip")
    command = ["store", "import", str(copy), "--store", str(store), "--allow-other-machines"]
    assert main(command) == 2
    assert one_error_line(capsys).startswith(f"error: {copy}: damaged (its sha256 does not")
    inject(sidecar, "truncate")
    assert main(command) == 2
    assert one_error_line(capsys).startswith(f"error: {sidecar}: damaged (not a sha256 line)")
    # the shipped seeds must carry their sidecars; other Parquet files may lack them
    sidecar.unlink()
    monkeypatch.setattr(integrity, "SHIPPED_FOLDERS", (tmp_path,))
    assert main(command) == 2
    assert one_error_line(capsys) == f"error: {sidecar}: missing; restore it from a copy, or " + (
        "export it again (`mlirrl-jax store export`)"
    )


def test_an_export_carries_its_checksum(tmp_path):
    path = tmp_path / "export.parquet"
    with MeasurementStore(tmp_path / "a.db") as store:
        store.export_parquet(path)
    assert integrity.verify_file(path, "-")
    with MeasurementStore(tmp_path / "b.db") as other:
        other.import_parquet(path)
        inject(path, "truncate")
        with pytest.raises(IntegrityError, match=f"^{path}: damaged"):
            other.import_parquet(path)


def test_sealing_names_changed_files_and_a_surrogate_predicting_nan_is_refused(tmp_path, capsys):
    """Parameters damaged to NaN (a fault injected: NaN weights saved over a sealed copy's
    checkpoint): `seal` refuses the changed folder, naming its files, unless --force; sealed
    anyway, its weights refuse the load: every prediction made with them is NaN."""
    import jax

    model = CostModel.load(SHIPPED_SURROGATE)
    folder = shutil.copytree(SHIPPED_SURROGATE, tmp_path / "surrogate")
    nan = CostModel(model.graphdef, jax.tree.map(lambda a: a * np.nan, model.params), model.meta)
    nan.save(tmp_path / "nan")
    shutil.rmtree(folder / "checkpoint")
    shutil.copytree(tmp_path / "nan" / "checkpoint", folder / "checkpoint")
    changed = sorted(
        p.relative_to(folder).as_posix()
        for p in files_of(folder)
        if p.name != integrity.MANIFEST
        and integrity.listed(folder).get(p.relative_to(folder).as_posix()) != integrity.sha256_of(p)
    )
    assert changed
    before = (folder / integrity.MANIFEST).read_bytes()
    assert integrity.main(["seal", str(folder)]) == 2
    line = one_error_line(capsys)
    assert str(folder) in line and changed[0] in line and "--force" in line
    assert (folder / integrity.MANIFEST).read_bytes() == before  # nothing blessed
    assert integrity.main(["seal", "--force", str(folder)]) == 0
    assert changed[0] in capsys.readouterr().out  # what it blessed, named
    assert integrity.main(["verify", str(folder)]) == 0
    with pytest.raises(IntegrityError, match=r"weights hold \d+ NaN or infinite values") as caught:
        CostModel.load(folder)
    assert str(caught.value).startswith(f"{folder}: ") and "\n" not in str(caught.value)
    intact = shutil.copytree(SHIPPED_SURROGATE, tmp_path / "intact")
    assert integrity.main(["seal", str(intact)]) == 0  # unchanged: sealed again as it was
    assert integrity.verify(intact, "-")
    assert CostModel.load(SINGLE_MACHINE_SURROGATE).meta["feature_version"] == 4
