"""The surrogate's settings: the network's shape (`ModelConfig`) and how it is fitted
(`TrainConfig`). Plain dataclasses, free of JAX, so that the command line reads their fields
and documentation without loading it (`cli.options`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.util.configs import option

TEACHERS = ("trees", "networks", "none")
TRAINABLE = ("all", "head")


@dataclass(frozen=True)
class ModelConfig:
    """The surrogate network's shape.

    Its fields are declared alike, each documented (`util.configs.option`): the flags and
    their help come from them (`cli.options`).
    """

    loop_width: int = option(
        0, doc="loop token size (0: an op reads its loops' features flattened)"
    )
    op_width: int = option(64, doc="op token size")
    heads: int = option(
        2, doc="attention heads across ops (0: ops exchange a pooled context instead)"
    )
    members: int = option(
        1, doc="an ensemble of this many networks (different initial weights), averaged"
    )
    seed: int = 0
    machine_inputs: bool = option(
        True,
        doc=(
            "read the machine's profile and the kernel's threads (`machine_features`); False:"
            " a network of features version 4, fitted before they existed, which reads "
            "neither"
        ),
    )

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainConfig:
    """How the surrogate is fitted.

    Its fields are declared alike, each documented (`util.configs.option`): the flags and
    their help come from them (`cli.options`).
    """

    epochs: int = option(
        200,
        doc=(
            "passes over the training rows, up to `max_steps` batches per network (of a "
            "networks teacher, or a network fitted alone; `distill_max_steps` caps the "
            "distilled one): the work grows with the rows until the caps, which keep the "
            "default fit within 10 minutes on a 2-core machine"
        ),
    )
    max_steps: int | None = option(
        15000, doc="batches per network at most (None: `epochs` alone bound the fit)"
    )
    programs_per_batch: int = option(16, doc="programs sampled per batch")
    rows_per_program: int = option(16, doc="rows sampled per program in a batch")
    learning_rate: float = option(2e-3, doc="peak of the warmup-cosine schedule")
    weight_decay: float = 1e-4
    feature_noise: float = option(
        0.0,
        doc=(
            "std of Gaussian noise added to op and loop features in training (a regularizer "
            "that helped networks fitted on the measurements alone; a distilled network does "
            "better without)"
        ),
    )
    difference_weight: float = option(
        1.0, doc="weight of the within-program log-time difference loss"
    )
    rank_weight: float = option(0.5, doc="weight of the within-program logistic ranking loss")
    listwise_weight: float = option(
        0.0,
        doc=(
            "weight of a listwise ranking loss (ListNet: cross-entropy between each program's"
            " softmax over -measured and over -predicted log time at `listwise_temperature`),"
            " which weighs the fastest schedules of a program most"
        ),
    )
    listwise_temperature: float = 0.1
    bootstrap: bool = option(
        True,
        doc=(
            "an ensemble's members (`model.members` > 1) each train on their own bootstrap "
            "resample of the table's programs, besides their own batch order and initial "
            "weights: where the data say little, the members disagree, and their spread is "
            "the prediction's uncertainty. A single network, and a networks teacher, see "
            "every program."
        ),
    )
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    teacher: str = option(
        "trees",
        doc=(
            "distillation: a teacher is fitted first, then `model` (the network shipped) on "
            "the training rows plus `distill_states` random states of the training programs "
            'labeled by the teacher, for `distill_epochs` passes. Teachers: "trees" '
            '(gradient-boosted trees, `mlirrl_jax.surrogate.teacher`), "networks" (an '
            'ensemble of `teacher_members` networks), "none"'
        ),
    )
    teacher_rounds: int = option(500, doc="trees boosted (1,000 labeled no better in a probe)")
    teacher_leaves: int = option(127, doc="leaves per tree")
    teacher_members: int = option(3, doc='networks in a "networks" teacher')
    teacher_op_width: int = option(64, doc="of a networks teacher (it only labels, never serves)")
    distill_states: int = option(
        150000,
        doc="random states of the training programs the teacher labels for the distilled network",
    )
    distill_epochs: int = option(
        300, doc="passes of the distilled network over its rows and states"
    )
    distill_max_steps: int | None = option(
        40000, doc="the distilled network's cap (`max_steps`: the rest)"
    )
    trainable: str = option(
        "all",
        doc=(
            'which weights a fit changes: "all", or "head" (the output layers only, '
            "`HEAD_LAYERS`: a per-machine head over the frozen shared layers, for fine-tuning"
            " on a few rows)"
        ),
    )

    def __post_init__(self):
        if self.teacher not in TEACHERS:
            raise ConfigError(f"teacher {self.teacher!r}: expected one of {', '.join(TEACHERS)}")
        if self.trainable not in TRAINABLE:
            raise ConfigError(
                f"trainable {self.trainable!r}: expected one of {', '.join(TRAINABLE)}"
            )

    def to_json(self) -> dict:
        return asdict(self)
