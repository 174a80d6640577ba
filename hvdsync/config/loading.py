"""The whole config (its cross-section checks) and how it is built: defaults, a YAML file, ``--set`` overrides."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from hvdsync.config.checks import ConfigError, _import_plugins
from hvdsync.config.sections import (DataConfig, ElasticConfig, MonitorConfig, SyncConfig, TrackingConfig,
                                     TrainConfig)
from hvdsync.core.comm.schemes import MODES

@dataclass
class Config:
    """The whole config: ``sync``, ``data``, ``train``, ``tracking``, ``elastic``, ``monitor``."""

    sync: SyncConfig = field(default_factory=SyncConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def __post_init__(self) -> None:
        if self.elastic.enabled and not self.elastic.min_np <= self.train.np <= self.elastic.max_np:
            raise ConfigError(f"train.np: {self.train.np} is not allowed with elastic training; expected from "
                              f"elastic.min_np ({self.elastic.min_np}) to elastic.max_np ({self.elastic.max_np})")
        if self.elastic.enabled and (self.data.shares != "equal" or self.data.batch_growth):
            field_name = "data.shares" if self.data.shares != "equal" else "data.batch_growth"
            raise ConfigError(f"{field_name}: {getattr(self.data, field_name[5:])!r} is not allowed with elastic "
                              "training; the elastic loop re-plans with equal shares and a constant batch")
        if self.data.batch_size < self.sync.accumulate:
            raise ConfigError(
                f"sync.accumulate: {self.sync.accumulate} is not allowed with data.batch_size "
                f"{self.data.batch_size}; expected at most data.batch_size micro-batches per step"
            )
        problem = MODES[self.sync.mode].problem(dataclasses.asdict(self.sync), self.train.framework, self.train.np,
                                                self.train.precision, self.elastic.enabled)
        if problem:
            raise ConfigError(problem)

    # ---- building -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> "Config":
        """Build from a nested mapping; unknown sections or fields are errors that list the known ones."""
        raw = dict(raw or {})
        train = raw.get("train")
        if isinstance(train, Mapping) and "plugins" in train:
            # First: a plugin may register the data set that the data section names.
            _import_plugins("train.plugins", train["plugins"])
        sections = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(sections))
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown section; known sections: {', '.join(sections)}")
        parts = {}
        for name, f in sections.items():
            section_type = f.default_factory  # type: ignore[misc]
            values = raw.get(name) or {}
            if not isinstance(values, Mapping):
                raise ConfigError(f"{name}: expected a mapping of fields, got {values!r}")
            known = {x.name for x in dataclasses.fields(section_type)}
            bad = sorted(set(values) - known)
            if bad:
                raise ConfigError(f"{name}.{bad[0]}: unknown field; known fields: {', '.join(sorted(known))}")
            parts[name] = section_type(**values)
        return cls(**parts)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> "Config":
        """Defaults, then the YAML file at ``path`` (if any), then ``section.field=value`` overrides."""
        raw: dict[str, Any] = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                what = "is a folder; give the path of a YAML file" if p.is_dir() else "does not exist"
                raise ConfigError(f"config file: {str(p)!r} {what}")
            loaded = _parse_yaml(_read_text(p), f"config file {str(p)!r}", "a YAML or JSON mapping of sections") or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file: {str(p)!r} must hold a mapping of sections")
            raw = loaded
        for item in overrides:
            apply_override(raw, item)
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """``{"sync.compression": "fp16", ...}``: the names MLflow records as run parameters."""
        return {f"{s}.{k}": v for s, d in self.to_dict().items() for k, v in d.items()}

    def replace(self, **sections: Mapping[str, Any]) -> "Config":
        """A copy with some fields changed: ``cfg.replace(sync={"accumulate": 4})`` (validated again)."""
        raw = self.to_dict()
        for name, values in sections.items():
            if name not in raw:
                raise ConfigError(f"{name}: unknown section; known sections: {', '.join(raw)}")
            raw[name].update(values)
        return Config.from_dict(raw)


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one ``section.field=value`` override (value parsed as YAML: ``4``, ``true``, ``fp16``)."""
    key = item.split("=", 1)[0]
    if "=" not in item or "." not in key or not all(part.strip() for part in key.split(".", 1)):
        raise ConfigError(f"override: {item!r} is not allowed; expected section.field=value, e.g. sync.accumulate=4")
    key, value = item.split("=", 1)
    section, name = key.strip().split(".", 1)
    raw.setdefault(section, {})
    if not isinstance(raw[section], dict):
        raise ConfigError(f"{section}: expected a mapping of fields, got {raw[section]!r}")
    raw[section][name] = _parse_yaml(value, f"--set {item!r}", "a YAML value: 4, 0.1, true, fp16, [1, 2], "
                                     "or quoted text", position=False) if value.strip() else ""


def _read_text(path: Path) -> str:
    """The text of a config file, or one line naming it: unreadable, or not UTF-8 (YAML's and JSON's encoding)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {str(path)!r}, line {line}: byte {exc.object[exc.start]:#04x} (at offset "
                          f"{exc.start}) is not UTF-8 ({exc.reason}); save the file as UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read ({exc.strerror or exc})") from None


def _parse_yaml(text: str, source: str, allowed: str, position: bool = True) -> Any:
    """``yaml.safe_load(text)``, its syntax errors as one line: where (line and column, counted from 1, as an
    editor shows them) and what the parser found, instead of its multi-line report."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None and position else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        raise ConfigError(f"{source}{where}: {context + ': ' if context else ''}{problem}; expected {allowed}") \
            from exc  # the parser's own report: shown with --debug


def from_command_line(argv: list[str] | None = None, framework: str | None = None) -> Config:
    """The config of a user's training script: ``--config FILE`` and repeated ``--set section.field=value``.

    Example (in a script launched with ``horovodrun``)::

        cfg = from_command_line(framework="torch")   # python train.py --config run.yaml --set sync.accumulate=4
    """
    import argparse

    parser = argparse.ArgumentParser(description="Train with hvdsync (config: sections sync, data, train, tracking).")
    parser.add_argument("--config", help="YAML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config field; repeatable")
    args = parser.parse_args(argv)
    pinned = [f"train.framework={framework}"] if framework else []
    return Config.load(args.config, args.overrides + pinned)
