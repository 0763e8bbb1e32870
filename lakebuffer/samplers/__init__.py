"""Sampling strategies, built by name or by class: ``lakebuffer.samplers.get("uniform")``.

Registered: ``uniform``, ``prioritized_time``, ``freshness``, ``reward``, ``success_blend``,
``group``, ``episode``, ``segment``, ``team``, ``max_reuse``, ``priority`` (each class's
docstring lists its options). All select keys from metadata only, combine with a SQL ``where``,
are deterministic given the seed, and raise ``NotEnoughRowsError`` when short (unless built with
``allow_fewer=True``).

``register(name, cls)`` adds a user's own (a ``Sampler`` subclass or any class with
``sample(catalog, n, where, rng)``); ``resolve`` turns what ``ReplayBuffer.sample`` was given (a name,
a class or an instance) into a sampler. The registry itself is :mod:`.registry`.
"""

from __future__ import annotations

from .base import Sampler
from .episode import EpisodeSampler
from .filtered import FilteredSampler
from .freshness import FreshnessSampler
from .group import GroupSampler
from .max_reuse import MaxReuseSampler
from .prioritized_time import PrioritizedTimeSampler
from .priority import PrioritySampler, WeightedSampler
from .registry import PluginSampler, draw, get, lookup, names, option_names, register, resolve
from .reward import RewardSampler
from .segment import SegmentSampler
from .success_blend import SuccessBlendSampler
from .team import TeamSampler
from .uniform import UniformSampler

for _cls in (
    UniformSampler,
    PrioritizedTimeSampler,
    FreshnessSampler,
    RewardSampler,
    SuccessBlendSampler,
    GroupSampler,
    EpisodeSampler,
    SegmentSampler,
    TeamSampler,
    MaxReuseSampler,
    PrioritySampler,
):
    register(_cls.name, _cls)
del _cls

__all__ = [
    "EpisodeSampler",
    "FilteredSampler",
    "FreshnessSampler",
    "GroupSampler",
    "MaxReuseSampler",
    "PluginSampler",
    "PrioritizedTimeSampler",
    "PrioritySampler",
    "RewardSampler",
    "Sampler",
    "SegmentSampler",
    "SuccessBlendSampler",
    "TeamSampler",
    "UniformSampler",
    "WeightedSampler",
    "draw",
    "get",
    "lookup",
    "names",
    "option_names",
    "register",
    "resolve",
]
