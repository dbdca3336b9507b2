"""The evsys front door: a drop-in for ``evsys_sdk.training.data_processing``
(:mod:`.data_processing`), its input types (:mod:`.env`) and row metadata
(:mod:`.metadata`). ``tinker_rl_data`` re-exports the functions."""

from .data_processing import Advantages as Advantages
from .data_processing import DatumMetadata as DatumMetadata
from .data_processing import RowArrays as RowArrays
from .data_processing import assemble_arrays as assemble_arrays
from .data_processing import assemble_training_data as assemble_training_data
from .data_processing import compute_advantages as compute_advantages
from .data_processing import compute_trajectory_metrics as compute_trajectory_metrics
from .data_processing import remove_constant_reward_groups as remove_constant_reward_groups
from .env import Trajectory as Trajectory
from .env import TrajectoryGroup as TrajectoryGroup
from .env import Turn as Turn
