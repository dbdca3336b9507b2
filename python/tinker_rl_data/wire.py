"""The older import path of :func:`encode_forward_backward` (now
:mod:`tinker_rl_data.tinker.forward_backward`, also ``tinker_rl_data.encode_forward_backward``)."""

from .tinker.forward_backward import encode_forward_backward as encode_forward_backward

__all__ = ["encode_forward_backward"]
