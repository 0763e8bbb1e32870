"""The sampler registry: names -> classes, and turning what ``sample(sampler=...)`` was given into a sampler.

A user's sampler is any class (or object) with ``sample(catalog, n, where, rng)`` returning keys:
subclassing :class:`~.base.Sampler` is not required. One that does not subclass it is wrapped in
:class:`PluginSampler`, which gives it the base's defaults (``needs_counts=False``, ``info`` = the keys)
unless it defines them itself. This module sits under the strategies (``filtered`` builds its base
sampler through it) and above ``base``; ``samplers/__init__`` registers the built-in strategies.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import OptionError, SamplerError
from ..predicate import check
from .base import Sampler

_REGISTRY: dict[str, type] = {}

_HOW = ("a sampler is a class (or object) with sample(self, catalog, n, where, rng) returning the chosen keys "
        "(see README, 'Samplers')")


class PluginSampler(Sampler):
    """A user's object with ``sample(catalog, n, where, rng)`` that does not subclass ``Sampler``."""

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin

    @property
    def needs_counts(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.plugin, "needs_counts", False))

    @property
    def allow_fewer(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.plugin, "allow_fewer", False))

    def sample(self, catalog: Any, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        return self.plugin.sample(catalog, n, where, rng)

    def info(self, catalog: Any, keys: pa.Array, where: str | None) -> dict[str, pa.Array]:
        own = getattr(self.plugin, "info", None)
        return own(catalog, keys, where) if callable(own) else super().info(catalog, keys, where)

    def __repr__(self) -> str:
        return repr(self.plugin)


def _check_sample_method(obj: Any, what: str) -> None:
    """Refuse early (at ``register`` / ``sample``) what has no usable ``sample(catalog, n, where, rng)``."""
    method = getattr(obj, "sample", None)
    if not callable(method):
        raise SamplerError(f"{what} has no sample method; {_HOW}")
    try:
        sig = inspect.signature(method)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    args = (None, None, 0, None, None) if isinstance(obj, type) else (None, 0, None, None)
    try:
        sig.bind(*args)
    except TypeError:
        raise SamplerError(f"{what}.sample{sig} cannot be called as sample(catalog, n, where, rng); {_HOW}") from None


def register(name: str, cls: type) -> type:
    """Make ``cls`` buildable by ``name`` (options go to its constructor); returns ``cls``.

    ``cls`` is a :class:`Sampler` subclass or any class with ``sample(self, catalog, n, where, rng)``.
    """
    if not isinstance(cls, type):
        raise SamplerError(f"register({name!r}, ...) takes a class, not {type(cls).__name__} {cls!r}; {_HOW}")
    if not issubclass(cls, Sampler):
        _check_sample_method(cls, cls.__name__)
    _REGISTRY[name] = cls
    return cls


def lookup(name: str) -> type | None:
    """The class registered as ``name`` (None if none)."""
    return _REGISTRY.get(name)


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str, **options: Any) -> Sampler:
    """Build the sampler registered as ``name`` with ``options``."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise OptionError(f"unknown sampler {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None
    return _build(cls, name, options)


def option_names(cls: type, options: dict[str, Any] | None = None) -> list[str]:
    """The keyword options ``cls`` takes, plus those it passes on (a filtered sampler: its base's)."""
    params = inspect.signature(cls.__init__).parameters.values()
    names = [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if issubclass(cls, Sampler):
        names += [n for n in cls.passed_on_options(options or {}) if n not in names]
    return names


def _build(cls: type, name: str, options: dict[str, Any]) -> Sampler:
    """``cls(**options)``, with a misspelt option named against the sampler the user chose
    (a filtered sampler hands unknown options to its base, whose TypeError would name the base)."""
    if issubclass(cls, Sampler) and cls.forwards_options:  # its base would report the bad option as its own
        known = option_names(cls, options)
        unknown = [k for k in options if k not in known]
        if unknown:
            raise OptionError(f"sampler {name!r} has no option {unknown[0]!r}; its options: {', '.join(known)} "
                              f"(see {cls.__module__}.{cls.__name__})")
    try:
        built = cls(**options)
    except TypeError as e:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if m is None:
            raise
        raise OptionError(f"sampler {name!r} has no option {m.group(1)!r}; its options: "
                          f"{', '.join(option_names(cls)) or '(none)'} (see {cls.__module__}.{cls.__name__})") from None
    return built if isinstance(built, Sampler) else PluginSampler(built)


def resolve(sampler: Any, **options: Any) -> Sampler:
    """A sampler from a registered name, a class (``Sampler`` subclass or not) or an instance."""
    if sampler is None:
        sampler = "uniform"
    if isinstance(sampler, str):
        return get(sampler, **options)
    if isinstance(sampler, type):
        if not issubclass(sampler, Sampler):
            _check_sample_method(sampler, sampler.__name__)
        return _build(sampler, getattr(sampler, "name", "") or sampler.__name__, options)
    if options:
        raise SamplerError("options are given to the sampler's constructor, not with an instance "
                           f"(pass the class or a registered name with them, or build {type(sampler).__name__} yourself)")
    if isinstance(sampler, Sampler):
        return sampler
    _check_sample_method(sampler, f"{type(sampler).__name__} instance")
    return PluginSampler(sampler)


def draw(strategy: Sampler, catalog: Any, n: int, where: str | None, seed: int | None) -> pa.Array:
    """Run ``strategy`` with a seeded RNG; the keys as one Arrow string array (shared by buffers and lake views)."""
    check(where)
    keys = strategy.sample(catalog, int(n), where, np.random.default_rng(seed))
    if isinstance(keys, pa.ChunkedArray):
        return keys.combine_chunks()
    if not isinstance(keys, pa.Array):  # a plugin's list / NumPy array of keys
        return pa.array(keys, pa.string())
    return keys
