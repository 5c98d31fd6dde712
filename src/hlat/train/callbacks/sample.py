"""The end-of-run sample (hlat.train.sample) as a callback: train.sample_prompt."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlat.parallel.hang import watch
from hlat.train.callbacks.base import Callback
from hlat.train.sample import end_of_training_sample

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer, TrainSummary


class Sample(Callback):
    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        cfg = trainer.cfg
        with watch(trainer.layout, "end-of-training sample (gathering the weights to rank 0)", trainer.step):
            sample = end_of_training_sample(
                trainer.model.parts,
                trainer.layout,
                cfg.model,
                cfg.data,
                trainer.tokenizer,
                trainer.device,
                cfg.precision.mode,
                cfg.train.sample_prompt,
                cfg.train.sample_tokens,
            )
        if sample:
            trainer.out(sample)
