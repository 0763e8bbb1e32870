"""Sampling strategies, built by name or by class: ``lakebuffer.samplers.get("uniform")``.

Registered: ``uniform``, ``prioritized_time``, ``freshness``, ``reward``, ``success_blend``,
``group``, ``episode``, ``segment``, ``team``, ``max_reuse``, ``priority`` (each class's
docstring lists its options). All select keys from metadata only, combine with a SQL ``where``,
are deterministic given the seed, and raise ``NotEnoughRowsError`` when short (unless built with
``allow_fewer=True``).

``register(name, cls)`` adds a user's own; ``resolve`` turns what ``ReplayBuffer.sample`` was given
(a name, a class or an instance) into a sampler.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import OptionError
from ..predicate import check
from .base import Sampler
from .episode import EpisodeSampler
from .filtered import FilteredSampler
from .freshness import FreshnessSampler
from .group import GroupSampler
from .max_reuse import MaxReuseSampler
from .prioritized_time import PrioritizedTimeSampler
from .priority import PrioritySampler, WeightedSampler
from .reward import RewardSampler
from .segment import SegmentSampler
from .success_blend import SuccessBlendSampler
from .team import TeamSampler
from .uniform import UniformSampler

_REGISTRY: dict[str, type[Sampler]] = {}


def register(name: str, cls: type[Sampler]) -> type[Sampler]:
    """Make ``cls`` buildable by ``name``; returns ``cls`` (usable as a decorator helper)."""
    if not (isinstance(cls, type) and issubclass(cls, Sampler)):
        raise TypeError(f"{cls!r} is not a Sampler subclass")
    _REGISTRY[name] = cls
    return cls


def get(name: str, **options: Any) -> Sampler:
    """Build the sampler registered as ``name`` with ``options``."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise OptionError(f"unknown sampler {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None
    return _build(cls, name, options)


def _option_names(cls: type, base: Any = "uniform") -> list[str]:
    """The keyword options ``cls`` takes (a filtered sampler also passes its base's on)."""
    params = inspect.signature(cls.__init__).parameters.values()
    names = [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if issubclass(cls, FilteredSampler):
        base_cls = _REGISTRY.get(base) if isinstance(base, str) else base if isinstance(base, type) else None
        if base_cls is not None:
            names += [n for n in _option_names(base_cls) if n not in names]
    return names


def _build(cls: type[Sampler], name: str, options: dict[str, Any]) -> Sampler:
    """``cls(**options)``, with a misspelt option named against the sampler the user chose
    (a filtered sampler hands unknown options to its base, whose TypeError would name the base)."""
    if issubclass(cls, FilteredSampler):  # check here: its base would report the bad option as its own
        known = _option_names(cls, options.get("base", "uniform"))
        unknown = [k for k in options if k not in known]
        if unknown:
            raise OptionError(f"sampler {name!r} has no option {unknown[0]!r}; its options: {', '.join(known)} "
                              f"(see lakebuffer.samplers.{cls.__name__})")
    try:
        return cls(**options)
    except TypeError as e:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if m is None:
            raise
        raise OptionError(f"sampler {name!r} has no option {m.group(1)!r}; its options: "
                          f"{', '.join(_option_names(cls))} (see lakebuffer.samplers.{cls.__name__})") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def resolve(sampler: str | Sampler | type[Sampler] | None, **options: Any) -> Sampler:
    if sampler is None:
        sampler = "uniform"
    if isinstance(sampler, str):
        return get(sampler, **options)
    if isinstance(sampler, type) and issubclass(sampler, Sampler):
        return _build(sampler, sampler.name or sampler.__name__, options)
    if isinstance(sampler, Sampler):
        if options:
            raise TypeError("options are given to the sampler's constructor, not with an instance")
        return sampler
    raise TypeError(f"sampler must be a name, a Sampler class or instance, not {type(sampler).__name__}")


def draw(strategy: Sampler, catalog: Any, n: int, where: str | None, seed: int | None) -> pa.Array:
    """Run ``strategy`` with a seeded RNG; the keys as one Arrow array (shared by buffers and lake views)."""
    check(where)
    keys = strategy.sample(catalog, int(n), where, np.random.default_rng(seed))
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys


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
    "PrioritizedTimeSampler",
    "PrioritySampler",
    "RewardSampler",
    "Sampler",
    "SegmentSampler",
    "SuccessBlendSampler",
    "TeamSampler",
    "UniformSampler",
    "WeightedSampler",
    "get",
    "names",
    "register",
    "resolve",
]
