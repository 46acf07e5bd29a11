"""The named splits: every program in exactly one, decided by its name alone."""

import pytest

from mlirrl_jax import splits
from mlirrl_jax.programs import suites


def test_every_suite_program_is_in_one_split_and_test_is_the_suites_own():
    for name in suites.list_suites():
        for entry in suites.suite(name):
            split = splits.split_of(entry.uri)
            assert split in splits.SPLITS
            assert (split == splits.TEST) == (entry.split == "test"), entry.uri


def test_surrogate_validation_is_dl_v0_resnet50_plus_a_hashed_share():
    chosen = splits.entries(splits.SURROGATE_VALIDATION, suites.list_suites())
    assert chosen and all(e.uri.startswith("suite://dl-v0/") for e in chosen)
    dl_v0_train = [e for e in suites.split("dl-v0", "train")]
    resnet50 = [e for e in dl_v0_train if e.model == "resnet50"]
    assert all(splits.split_of(e.uri) == splits.SURROGATE_VALIDATION for e in resnet50)
    others = [e for e in dl_v0_train if e.model != "resnet50"]
    share = sum(splits.split_of(e.uri) == splits.SURROGATE_VALIDATION for e in others)
    assert 0.05 < share / len(others) < 0.25
    # VGG-16 is test, whole
    assert all(
        splits.split_of(e.uri) == splits.TEST for e in suites.suite("dl-v0") if e.model == "vgg16"
    )


def test_programs_outside_the_suites_train_and_bad_split_names_are_refused():
    assert splits.split_of("my_kernel") == splits.TRAIN
    assert splits.split_of("suite://dl-v0/no_such_program") == splits.TRAIN
    assert splits.suite_of("suite://shapes-v1/x") == "shapes-v1"
    with pytest.raises(ValueError, match="surrogate-validation"):
        splits.entries("validation", ["dl-v0"])
