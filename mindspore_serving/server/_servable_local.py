"""Local (non-distributed) servables: the start-config merge used by start_servables."""

from mindspore_serving.server.start_config import (
    ServableStartConfig,
    check_servable_configs,
    merge_config,
    newest_version,
)

__all__ = ["merge_config", "ServableStartConfig", "check_servable_configs", "newest_version"]
