"""Typed configuration for hvdsync: one config for both frameworks.

Every value is checked when the config is built (``__post_init__``), so a bad value fails in the launcher,
before any Horovod worker starts, with an error that names the field and what is allowed::

    >>> Config.from_dict({"sync": {"compression": "fp8"}})
    Traceback (most recent call last):
    ConfigError: sync.compression: 'fp8' is not allowed; choose one of: none, fp16, bf16, topk:<ratio>, randk:<ratio>, int8, powersgd:<rank>

A config comes from defaults, then a YAML file, then ``section.field=value`` overrides (the CLI's ``--set``).
"""
from hvdsync.config.checks import (FRAMEWORKS, LR_SCALING, OPTIMIZERS, PRECISIONS, REDUCE_OPS,  # noqa: F401
                                   ConfigError)
from hvdsync.config.loading import Config, apply_override, from_command_line  # noqa: F401
from hvdsync.config.sections import (DataConfig, ElasticConfig, MonitorConfig, SyncConfig,  # noqa: F401
                                     TrackingConfig, TrainConfig)
