"""What names a run: its kind, its typed config and the key the results store files it under.

A run is identified by ``kind`` (what computes it, e.g. ``"e1-paths"``), its full ``config`` (every
setting that changes the numbers: data sizes, seeds, step sizes, steps, p values) and the code that
computes it: the fingerprint (``mdlib.experiments.fingerprint``) of the module that computes the kind
(:data:`KINDS`) and of every mdlib module it imports (of all of mdlib for a kind not in the table). Its key
is the sha256 of the canonical JSON of ``{"kind": kind, "config": config, "code": fingerprint}``
(sorted keys, no whitespace), so a change of that code is recomputed, never served the old numbers.
A ``RunId`` holds the four, made once per run and passed to whatever visits the run in the store.

A config is a typed ``Config`` (a frozen dataclass that callers read by attribute) or a plain mapping;
the key is taken of its ``to_dict()``, the one place a typed config becomes the dict the store keeps.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, TypeVar

import numpy as np

from mdlib.experiments import fingerprint

__all__ = ["KINDS", "Config", "RunId", "canonical_json", "check_keys", "check_name", "code_of", "config_key", "kind",
           "plain"]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME = 128  #: the most characters of a kind, run name or result name


def plain(obj: Any, where: str = "config", finite: bool = True) -> Any:
    """Plain JSON data for hashing: a ``Config`` -> its ``to_dict()``, tuples -> lists, numpy
    scalars/arrays -> Python, Paths -> str."""
    if isinstance(obj, Config):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings, got {key!r}")
            out[key] = plain(value, f"{where}.{key}", finite)
        return out
    if isinstance(obj, (list, tuple)):
        return [plain(value, f"{where}[{i}]", finite) for i, value in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist(), where, finite)
    if isinstance(obj, np.generic):
        return plain(obj.item(), where, finite)
    if isinstance(obj, Path):
        return str(obj)
    if finite and isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"{where}: {obj} is not allowed in a run config (use None or a string)")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{where}: {type(obj).__name__} is not JSON data; put plain numbers, strings, "
                    "lists and dicts in a run config")


def canonical_json(obj: Any) -> str:
    """``obj`` (``plain``) as JSON with sorted keys and no whitespace: what keys and stored configs are made of."""
    return json.dumps(plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"invalid {what} {name!r}: use letters, digits, '-', '_' or '.'")
    if len(name) > MAX_NAME:  # a file name: most file systems stop at 255 bytes
        raise ValueError(f"invalid {what} {name[:32]!r}... ({len(name)} characters): use at most {MAX_NAME}")
    return name


def check_keys(config: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    """Raise ValueError unless ``config`` has exactly ``keys`` (an experiment's config is complete, so
    the store keeps exactly what ran); ``what`` names the config in the message."""
    missing = [k for k in keys if k not in config]
    unknown = [k for k in config if k not in keys]
    if missing or unknown:
        raise ValueError(f"{what} has exactly the keys {', '.join(keys)}; missing {missing}, unknown {unknown}")


_C = TypeVar("_C", bound="Config")


class Config:
    """The base of the typed configs (frozen dataclasses), which callers read by attribute. The store
    takes a config as it is and serializes it at its door: ``to_dict()`` is the plain dict it hashes
    and keeps (nested configs as dicts), so a typed config and its dict name the same run;
    ``from_dict`` is its inverse (nested configs typed again)."""

    #: What the config is called in error messages ("a Table 1 grid config").
    WHAT = "a config"
    #: Compatibility with the entries stored before these fields existed: a field named here is left out
    #: of ``to_dict()`` while it holds its default (so those runs keep their keys), and ``from_dict``
    #: fills it in when a mapping lacks it. A field of a nested config is named by its path
    #: (``"fit.eval_every"``: a setting this kind of run did not have), besides that config's own.
    OMIT_AT_DEFAULT: typing.ClassVar[tuple[str, ...]] = ()

    def to_dict(self, omitted: tuple[str, ...] = ()) -> dict[str, Any]:
        """The config as the store keeps it: every field but those of ``OMIT_AT_DEFAULT`` (and ``omitted``,
        a parent config's names for this one) at their default, nested configs as dicts."""
        omit = self.OMIT_AT_DEFAULT + omitted
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in omit and value == f.default:
                continue
            out[f.name] = value.to_dict(_inside(omit, f.name)) if isinstance(value, Config) else copy.deepcopy(value)
        return out

    @classmethod
    def from_dict(cls: type[_C], config: Mapping[str, Any], omitted: tuple[str, ...] = ()) -> _C:
        """The typed config of a mapping with exactly its fields, those ``to_dict`` omits at their default
        at will (ValueError naming the missing and the unknown ones otherwise); a field typed as a
        ``Config`` is made from its mapping in turn."""
        omit = cls.OMIT_AT_DEFAULT + omitted
        names = tuple(f.name for f in fields(cls))
        check_keys({name: None for name in omit if name in names} | dict(config), names, cls.WHAT)
        hints = typing.get_type_hints(cls)
        values = {}
        for name, value in config.items():
            hint = hints[name]
            nested = isinstance(hint, type) and issubclass(hint, Config) and isinstance(value, Mapping)
            values[name] = hint.from_dict(value, _inside(omit, name)) if nested else value
        return cls(**values)

    @classmethod
    def of(cls: type[_C], config: "_C | Mapping[str, Any]") -> _C:
        """``config`` itself when it is one, else ``from_dict(config)``."""
        return config if isinstance(config, cls) else cls.from_dict(config)


def _inside(names: tuple[str, ...], nested: str) -> tuple[str, ...]:
    """The names of ``names`` inside the nested config ``nested``: "fit.pool" -> "pool" for "fit"."""
    return tuple(name[len(nested) + 1:] for name in names if name.startswith(f"{nested}."))


#: Every run kind and the module that computes its runs: the code in their keys is that module's
#: fingerprint (:func:`code_of`), read from this table so that no module need be imported to know it.
#: The module declares the kind with :func:`kind`, which checks it against this table.
KINDS: Mapping[str, str] = MappingProxyType({
    "e1-fixed-decoder": "mdlib.experiments.synthetic",
    "e2-single-instance": "mdlib.experiments.synthetic",
    "e3-joint": "mdlib.experiments.synthetic",
    "e4-sentiment": "mdlib.experiments.sentiment_run",
    "e4-grid": "mdlib.experiments.sentiment",
    "e4-baseline": "mdlib.experiments.sentiment",
    "e4-arms": "mdlib.experiments.allocation",
    "e7-vit": "mdlib.experiments.vision",
    "e7-grid": "mdlib.experiments.vision",
    "e7-pruning": "mdlib.experiments.vision",
    "e9-step-sizes": "mdlib.experiments.step_sizes",
    "e9-step-grid": "mdlib.experiments.step_sizes",
})


def kind(name: str, module: str) -> str:
    """Declare, in ``module`` (the caller's ``__name__``), that it computes the runs of kind ``name``;
    returns ``name``, e.g. ``KIND = store.kind("e4-sentiment", __name__)``. A ValueError unless
    :data:`KINDS` pairs them."""
    check_name(name, "run kind")
    known = KINDS.get(name)
    if known is None:
        raise ValueError(f"run kind {name!r} is not in mdlib.experiments.runkey.KINDS: add it there, "
                         f"computed by {module}")
    if known != module:
        raise ValueError(f"run kind {name!r} is computed by {known} (mdlib.experiments.runkey.KINDS); "
                         f"{module} must use another name")
    return name


def code_of(kind: str) -> str:
    """The code fingerprint in the keys of ``kind``'s runs: that of its module in :data:`KINDS`, else
    (a kind not in the table, e.g. a test's) all of mdlib's."""
    return fingerprint.fingerprint(KINDS.get(kind))


@dataclass(frozen=True)
class RunId:
    """A run's identity, made once (:meth:`of`) and passed to whatever finds, locks, writes or reads the
    run: its ``kind``, its ``config`` as the store keeps it (plain JSON data, ``Config.to_dict()`` of a
    typed one), the fingerprint of the ``code`` that computes it (:func:`code_of`) and its ``key``, the
    sha256 of the three. Two ids are equal when their kind, code and key are."""

    kind: str
    config: dict[str, Any] = field(compare=False)
    code: str
    key: str

    @classmethod
    def of(cls, kind: str, config: Config | Mapping[str, Any]) -> "RunId":
        """The identity of run (``kind``, ``config``): the key is the sha256 (hex) of the canonical JSON of
        ``{"kind": kind, "config": config, "code": code_of(kind)}``."""
        check_name(kind, "run kind")
        config, code = plain(config), code_of(kind)
        payload = canonical_json({"kind": kind, "config": config, "code": code})
        return cls(kind, config, code, hashlib.sha256(payload.encode("utf-8")).hexdigest())


def config_key(kind: str, config: Config | Mapping[str, Any]) -> str:
    """The key of run (``kind``, ``config``): ``RunId.of(kind, config).key``."""
    return RunId.of(kind, config).key
