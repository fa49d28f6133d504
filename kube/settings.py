"""How a long-running command is configured: one frozen dataclass, filled from its defaults, a
YAML file, the environment and flags, in that order (the later wins).

Every setting has an environment twin ``GPU_SLICER_<NAME>`` (field ``tls_cert`` is
``--tls-cert`` and ``GPU_SLICER_TLS_CERT``), so a Deployment or DaemonSet configures a command
without arguments. ``webhook serve`` (:class:`webhook.config.ServerConfig`) and ``agent run``
(:class:`slicer.settings.AgentSettings`) are such dataclasses; ``certs`` reads its twins with
:func:`env_value`. The prefix is defined here only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gpu_slicer.kube import documents

ENV_PREFIX = "GPU_SLICER_"

S = TypeVar("S", bound="Settings")


class SettingsError(ValueError):
    """Settings that cannot be used; ``problems`` name the flag, variable or file of each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def env_name(setting: str) -> str:
    """``tls_cert`` (or ``tls-cert``) -> ``GPU_SLICER_TLS_CERT``."""
    return ENV_PREFIX + setting.replace("-", "_").upper()


def env_value(
    setting: str, default: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The environment twin of one setting, else ``default``."""
    env = os.environ if environ is None else environ
    return env.get(env_name(setting), default)


class Settings:
    """What a settings dataclass inherits: reading it from a mapping, the environment and a
    file, writing it back to the environment, and checking it.

    Class attributes tune the sources: ``error`` is the error raised (a subclass of
    :class:`SettingsError` in the command's own package), ``config_setting`` names the setting
    whose twin points at a YAML file read beneath the environment (None: no file),
    ``env_aliases`` lists further variables read when the twin is unset (the Downward API's
    ``NODE_NAME``), and ``empty_env_is_unset`` treats ``X=`` as not set.
    """

    error: ClassVar[type[SettingsError]] = SettingsError
    config_setting: ClassVar[str | None] = None
    env_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    empty_env_is_unset: ClassVar[bool] = False

    def problems(self) -> list[str]:
        """What is wrong with these settings, each naming the flag; [] when usable."""
        return []

    def check(self: S) -> S:
        """Self, or the class's error listing every problem."""
        found = self.problems()
        if found:
            raise self.error(found)
        return self

    @classmethod
    def convert(cls, name: str, type_name: str, raw: Any) -> Any:
        """One value (a string from the environment, a YAML scalar, a parsed flag) converted
        to the field's type; ValueError says why it cannot be."""
        return convert(type_name, raw)

    @classmethod
    def from_mapping(
        cls: type[S],
        values: Mapping[str, Any],
        *,
        base: S | None = None,
        source: str = "settings",
    ) -> S:
        """``base`` with ``values`` (keys: field names, ``-`` or ``_``) converted and applied."""
        start = base or cls()
        types = {f.name: f.type for f in fields(start)}  # type: ignore[arg-type]
        changes: dict[str, Any] = {}
        problems: list[str] = []
        for raw_key, raw in values.items():
            key = str(raw_key).replace("-", "_")
            if key not in types:
                problems.append(f"{source}: unknown setting {raw_key!r}")
                continue
            try:
                changes[key] = cls.convert(key, str(types[key]), raw)
            except ValueError as exc:
                problems.append(f"{source}: {raw_key}: {exc}")
        if problems:
            raise cls.error(problems)
        return dataclasses.replace(start, **changes)  # type: ignore[type-var]

    @classmethod
    def from_env(
        cls: type[S], environ: Mapping[str, str] | None = None, *, base: S | None = None
    ) -> S:
        """Settings from ``GPU_SLICER_*`` (and, beneath them, the file its config twin names)."""
        env = os.environ if environ is None else environ
        if base is None:
            config_file = env.get(env_name(cls.config_setting)) if cls.config_setting else None
            base = cls.from_file(config_file) if config_file else cls()
        values: dict[str, str] = {}
        for f in fields(base):  # type: ignore[arg-type]
            for name in (env_name(f.name), *cls.env_aliases.get(f.name, ())):
                if name in env and (env[name] or not cls.empty_env_is_unset):
                    values[f.name] = env[name]
                    break
        return cls.from_mapping(values, base=base, source="environment")

    @classmethod
    def from_file(cls: type[S], path: str | os.PathLike[str]) -> S:
        try:
            data = documents.parse(documents.read_text(path))
        except documents.DocumentError as exc:
            raise cls.error([f"config file {path}: {exc}"]) from exc
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise cls.error([f"config file {path}: expected a mapping of settings"])
        return cls.from_mapping(data, source=str(path))

    def to_env(self) -> dict[str, str]:
        """The environment that makes :meth:`from_env` return these settings again."""
        env: dict[str, str] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None:
                continue
            env[env_name(f.name)] = (
                ("1" if value else "0") if isinstance(value, bool) else str(value)
            )
        return env


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def convert(type_name: str, raw: Any) -> Any:
    """Converts a string (env) or YAML scalar to a field's type, named as annotated."""
    optional = "None" in type_name
    if raw is None:
        if optional:
            return None
        raise ValueError("a value is required")
    if type_name.startswith("bool"):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"{raw!r} is not a boolean (use true or false)")
    if type_name.startswith("int"):
        try:
            return int(str(raw))
        except ValueError:
            raise ValueError(f"{raw!r} is not a whole number") from None
    if type_name.startswith("float"):
        try:
            return float(str(raw))
        except ValueError:
            raise ValueError(f"{raw!r} is not a number") from None
    text = str(raw)
    if optional and text == "":
        return None
    return Path(text) if type_name.startswith("Path") else text
