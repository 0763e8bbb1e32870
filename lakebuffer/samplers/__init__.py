"""Sampling strategies, built by name or by class: ``lakebuffer.samplers.get("uniform")``.

``register(name, cls)`` adds a user's own; ``resolve`` turns what ``ReplayBuffer.sample`` was given
(a name, a class or an instance) into a sampler.
"""

from __future__ import annotations

from typing import Any

from .base import Sampler
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
        raise ValueError(f"unknown sampler {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None
    return cls(**options)


def names() -> list[str]:
    return sorted(_REGISTRY)


def resolve(sampler: str | Sampler | type[Sampler] | None, **options: Any) -> Sampler:
    if sampler is None:
        sampler = "uniform"
    if isinstance(sampler, str):
        return get(sampler, **options)
    if isinstance(sampler, type) and issubclass(sampler, Sampler):
        return sampler(**options)
    if isinstance(sampler, Sampler):
        if options:
            raise TypeError("options are given to the sampler's constructor, not with an instance")
        return sampler
    raise TypeError(f"sampler must be a name, a Sampler class or instance, not {type(sampler).__name__}")


register("uniform", UniformSampler)

__all__ = ["Sampler", "UniformSampler", "get", "names", "register", "resolve"]
