"""Zeroth-order building blocks (ZO-HFL, and the FedRZO methods after it): sphere directions
from seeds, the two-point estimator, constraint projections, H_{i,r} schedules, and the
projected-SGD lower-level solver."""

from rayfl.zo.estimator import (
    forward_difference_estimate,
    quadratic_penalty,
    quadratic_penalty_difference,
    smoothed_gradient,
    two_point_estimate,
)
from rayfl.zo.lower_level import minibatch_indices, projected_sgd
from rayfl.zo.projection import (
    ConstraintConfig,
    moreau_gradient,
    project,
    project_halfspace,
    project_simplex,
)
from rayfl.zo.schedules import StepsSchedule, local_steps, step_size, total_steps
from rayfl.zo.sphere import direction_seed, sample_sphere, sphere_from_seed, step_direction_seed

__all__ = [
    "ConstraintConfig",
    "StepsSchedule",
    "direction_seed",
    "forward_difference_estimate",
    "local_steps",
    "minibatch_indices",
    "moreau_gradient",
    "project",
    "project_halfspace",
    "project_simplex",
    "projected_sgd",
    "quadratic_penalty",
    "quadratic_penalty_difference",
    "sample_sphere",
    "smoothed_gradient",
    "sphere_from_seed",
    "step_direction_seed",
    "step_size",
    "total_steps",
    "two_point_estimate",
]
