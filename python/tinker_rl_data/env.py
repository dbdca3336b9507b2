"""The older import path of the evsys input types (now :mod:`tinker_rl_data.evsys.env`)."""

from .evsys.env import Trajectory as Trajectory
from .evsys.env import TrajectoryGroup as TrajectoryGroup
from .evsys.env import Turn as Turn

__all__ = ["Trajectory", "TrajectoryGroup", "Turn"]
