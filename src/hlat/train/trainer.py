"""The training run: build every component from the config, resume, loop, log and checkpoint."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hlat.checkpoint import CheckpointManager
from hlat.config import RunConfig
from hlat.data import PackedLoader, build_tokenizer, open_source
from hlat.model import Llama, count_params, flops_per_token
from hlat.optim import build_adamw, lr_multiplier
from hlat.train.peak import peak_tflops, slow_bf16_warning
from hlat.train.precision import compute_dtype
from hlat.train.rng import load_rng_state, rng_state
from hlat.train.sinks import METRICS_FILE, PLOT_FILE, MetricSinks, perplexity, plot_loss
from hlat.train.step import train_step

RESUME_MODES = ("auto", "require", "fresh")


@dataclass
class TrainSummary:
    run_dir: Path
    step: int
    tokens: int
    final_loss: float | None  # mean loss of the last logging window; None if no step ran
    losses: list[float]  # the per-step losses of this invocation, in order


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device='cuda' but no CUDA device is visible; use --train.device cpu or auto")
    return torch.device(name)


class Trainer:
    def __init__(self, cfg: RunConfig, resume: str = "auto", out: Callable[[str], None] = print):
        if resume not in RESUME_MODES:
            raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}")
        self.cfg, self.resume, self.out = cfg, resume, out
        self.run_dir = cfg.run_dir
        if resume == "fresh":
            for name in ("checkpoints", "tensorboard", METRICS_FILE, PLOT_FILE):
                path = self.run_dir / name
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.toml").write_text(cfg.to_toml())

        self.device = pick_device(cfg.train.device)
        torch.manual_seed(cfg.train.seed)
        source = open_source(cfg.data)
        self.tokenizer, tokenizer_line = build_tokenizer(cfg.data, cfg.model.vocab_size, source)
        out(tokenizer_line)
        self.loader = PackedLoader(
            source, self.tokenizer, seq_len=cfg.data.seq_len, batch_size=cfg.train.micro_batch,
            seed=cfg.train.seed, max_doc_chars=cfg.data.max_doc_chars,
        )
        self.model = Llama(cfg.model).to(self.device)
        self.optimizer = build_adamw(self.model, cfg.optim)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", cfg.checkpoint.keep_last, cfg.checkpoint.verify)
        self.step, self.tokens = 0, 0
        self.flops_per_token = flops_per_token(cfg.model, cfg.data.seq_len)
        self.peak_tflops, peak_source = peak_tflops(self.device, compute_dtype(cfg.precision.mode), cfg.train.peak_tflops)
        out(
            f"model: {count_params(cfg.model) / 1e6:,.1f}M parameters, {self.flops_per_token / 1e9:.3f} GFLOP/token; "
            f"{cfg.precision.mode} precision on {self.device}; MFU against {self.peak_tflops:.3g} TFLOP/s ({peak_source})"
        )
        warning = slow_bf16_warning(self.device, cfg.precision.mode)
        if warning:
            out(warning)
        if resume != "fresh":
            self._resume()

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "loader": self.loader.state_dict(),
            "rng": rng_state(self.device),
            "progress": {"step": self.step, "tokens": self.tokens},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loader.load_state_dict(state["loader"])
        load_rng_state(state["rng"], self.device)
        self.step, self.tokens = state["progress"]["step"], state["progress"]["tokens"]

    def _resume(self) -> None:
        found = self.checkpoints.load_latest()
        if found is None:
            if self.resume == "require":
                raise FileNotFoundError(f"--resume: no valid checkpoint in {self.checkpoints.directory}; drop --resume to start a new run")
            return
        path, state = found
        self.load_state_dict(state)
        self.out(f"resuming from {path} (step {self.step:,}, {self.tokens:,} tokens)")

    def save(self) -> Path:
        return self.checkpoints.save(self.step, self.state_dict(), {"tokens": self.tokens})

    def fit(self) -> TrainSummary:
        cfg = self.cfg
        total, accum = cfg.train.steps, cfg.grad_accum_steps
        tokens_per_step = cfg.train.global_batch * cfg.data.seq_len
        if self.step >= total:
            self.out(f"run already complete at step {self.step:,} in {self.run_dir}; raise --train.steps or pass --fresh")
            return TrainSummary(self.run_dir, self.step, self.tokens, None, [])
        self.out(f"training {total - self.step:,} steps of {cfg.train.global_batch} x {cfg.data.seq_len} tokens ({accum} micro-batches of {cfg.train.micro_batch}) into {self.run_dir}")
        sinks = MetricSinks(self.run_dir, total, self.step, cfg.train.tensorboard)
        step_losses: list[torch.Tensor] = []  # device tensors: read on logging steps only
        window_start, window_time = len(step_losses), time.perf_counter()
        final_loss = None
        try:
            while self.step < total:
                batches = [self.loader.next_batch().to(self.device) for _ in range(accum)]
                lr = cfg.optim.lr * lr_multiplier(cfg.schedule, self.step)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                loss, grad_norm = train_step(self.model, self.optimizer, batches, cfg.precision.mode, cfg.optim.grad_clip)
                step_losses.append(loss)
                self.step += 1
                self.tokens += tokens_per_step
                sinks.advance()
                if self.step % cfg.train.log_every == 0 or self.step == total:
                    window = torch.stack(step_losses[window_start:]).mean().item()  # the one host sync
                    elapsed = time.perf_counter() - window_time
                    tokens_per_s = (len(step_losses) - window_start) * tokens_per_step / elapsed
                    final_loss = window
                    sinks.log({
                        "step": self.step, "loss": window, "ppl": perplexity(window), "lr": lr,
                        "grad_norm": grad_norm.item(), "param_norm": self._param_norm(),
                        "tokens": self.tokens, "tokens_per_s": tokens_per_s,
                        "mfu": tokens_per_s * self.flops_per_token / (self.peak_tflops * 1e12),
                    })
                    if not math.isfinite(window):
                        raise FloatingPointError(f"loss is {window} at step {self.step}; lower --optim.lr or check the data")
                    window_start, window_time = len(step_losses), time.perf_counter()
                if self.step % cfg.checkpoint.every == 0 or self.step == total:
                    path = self.save()
                    self.out(f"checkpoint: {path}")
        finally:
            sinks.close()
        plot = plot_loss(self.run_dir, f"{cfg.name}: {count_params(cfg.model) / 1e6:,.1f}M params")
        self.out(f"done: step {self.step:,}, {self.tokens:,} tokens, final loss {final_loss:.4f} (ln vocab = {math.log(cfg.model.vocab_size):.3f}); loss plot {plot}")
        return TrainSummary(self.run_dir, self.step, self.tokens, final_loss, [t.item() for t in step_losses])

    @torch.no_grad()
    def _param_norm(self) -> float:
        return torch.nn.utils.get_total_norm(list(self.model.parameters()), foreach=True).item()
