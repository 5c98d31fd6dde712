from hlat.optim.adamw import build_adamw, decay_groups
from hlat.optim.config import OptimConfig, ScheduleConfig
from hlat.optim.schedule import lr_multiplier

__all__ = ["OptimConfig", "ScheduleConfig", "build_adamw", "decay_groups", "lr_multiplier"]
