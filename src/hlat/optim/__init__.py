from hlat.optim.adamw import adamw_class, build_adamw, decay_groups, skips_exactly
from hlat.optim.bf16_adamw import BF16AdamW
from hlat.optim.schedule import lr_multiplier

__all__ = ["BF16AdamW", "adamw_class", "build_adamw", "decay_groups", "lr_multiplier", "skips_exactly"]
