"""The loop's validator: every trainer.eval_interval steps (sized to the run by default) and at the end, the validation loss, perplexity
and bits per byte (training/evaluation.py), per-layer activation RMS and a short sample, returned to the loop
(which keeps the best and decides early stopping: training/loop.py); the per-layer RMS of the residual
stream, the norms' outputs and the attention logits, via forward hooks attached only for the one batch that
measures them, so training steps pay nothing; and, if asked, each block's relative weight change."""
import itertools
import time
from typing import Callable, Dict, List, Optional

import torch

from model.attention import hook_attention_logits
from training.evaluation import Windows, evaluate, score


class Validator:
    def __init__(self, ctx):  # a training/context.py RunContext
        self.cfg, self.parts, self.data, self.info, self.state = ctx.cfg, ctx.parts, ctx.data, ctx.info, ctx.state
        self.windows = Windows.from_tiles(ctx.windows) if isinstance(ctx.windows, torch.Tensor) else ctx.windows
        self.weights = block_weights(ctx.parts.raw_model) if ctx.cfg.trainer.weight_change else None

    def should_validate(self, step: int) -> bool:
        """Every trainer.eval_interval steps (or the interval sized to the run's current end) and at the end."""
        return step % self.cfg.trainer.eval_every(self.state.max_steps) == 0 or step == self.state.end

    def time_one(self) -> float:
        """Seconds one validation takes (a time budget's probe): two batches timed after a first that
        compiles the eval graph, scaled to all of them, plus the activation-RMS batch and the sample."""
        trainer, parts = self.cfg.trainer, self.parts
        batches = list(itertools.islice(self.windows.batches(trainer.micro_batch_size), 3))
        n_batches = -(-len(self.windows) // trainer.micro_batch_size)
        parts.compute_loss.eval()
        timed = [time_call(lambda b=b: score(parts.compute_loss, b, trainer.micro_batch_size, self.info.device,
                                              parts.autocast)[0].item()) for b in batches]
        parts.compute_loss.train()
        per_batch = sum(timed[1:]) / max(len(timed) - 1, 1)
        extra = (time_call(self.activation_rms) if trainer.activation_rms else 0.0) + \
            (time_call(self.sample) if trainer.sample_tokens > 0 and parts.parallel != "fsdp" and self.info.is_main else 0.0)
        return n_batches * per_batch + extra

    def validate(self, log) -> dict:
        """The validation at this step: its row logged, its sample written; the result returned to the loop."""
        parts, trainer = self.parts, self.cfg.trainer
        ev = evaluate(parts.compute_loss, self.windows, trainer.micro_batch_size, parts.autocast, self.data.meta,
                      self.info)
        if trainer.activation_rms:  # every rank runs it: under FSDP the forward has collectives
            ev["act_rms"] = self.activation_rms()
        if trainer.weight_change:
            ev["weight_change"], self.weights = weight_change(self.weights, block_weights(parts.raw_model))
        log.log_eval(self.state.step, self.state.tokens_seen, ev)
        if trainer.sample_tokens > 0 and parts.parallel != "fsdp" and self.info.is_main:
            log.write(self.sample())
        return ev

    @torch.no_grad()
    def activation_rms(self) -> dict:
        """Per-layer RMS on the first validation batch, through the uncompiled loss module: hooks inside a
        compiled graph would force a recompile. Under FSDP2 the root must run, to gather embedding and head."""
        first = next(self.windows.batches(self.cfg.trainer.micro_batch_size))
        inputs, targets = first.inputs.to(self.info.device), first.targets.to(self.info.device)
        loss_module = self.parts.loss_module
        loss_module.eval()
        with self.parts.autocast():
            rms = activation_rms(self.parts.raw_model, inputs, lambda: loss_module(inputs, targets))
        loss_module.train()
        return rms

    def sample(self) -> str:
        """A short sample from trainer.sample_prompt — generated as scripts/generate.py does (model/generate.py,
        its SAMPLING defaults) — with its own seeded generator, which leaves the training RNG untouched."""
        from data.tokenizer import read_special_tokens
        from model.generate import SAMPLING, generate
        trainer, model = self.cfg.trainer, self.parts.raw_model
        model.eval()
        with self.parts.autocast():
            text = generate(model, self.data.tokenizer(), [trainer.sample_prompt], max_new_tokens=trainer.sample_tokens,
                            **SAMPLING, seed=self.cfg.seed, eos_token=read_special_tokens(self.data.dir)["eos"])[0]
        model.train()
        return "---- sample ----\n" + trainer.sample_prompt + text + "\n----------------"


def time_call(call) -> float:
    start = time.time()
    call()
    return time.time() - start


# ---- per-layer RMS of the residual stream: what RMSNorm exists to keep stable ----------------------------

def _rms(t: torch.Tensor) -> float:
    return t.detach().float().pow(2).mean().sqrt().item()


@torch.no_grad()
def activation_rms(model: torch.nn.Module, input_ids: torch.Tensor,
                   forward: Optional[Callable[[], object]] = None) -> Dict[str, List[float]]:
    """{'residual': [after block 0, 1, …], 'attn_in': [...], 'mlp_in': [...], 'attn_logits': [...]} for one
    batch; attn_logits: q·kᵀ × scale over the causal entries of the batch's first sequence, as the attention
    computes them (what μP's attention scale is meant to keep Θ(1) as width grows: docs/mup.md).

    `forward` runs the batch through whatever wraps `model` (under FSDP2 the root module must run,
    so that it gathers the embedding and head); by default `model(input_ids)`.
    """
    stats: Dict[str, List[float]] = {"residual": [], "attn_in": [], "mlp_in": [], "attn_logits": []}
    hooks = []
    for block in model.layers:
        hooks.append(block.register_forward_hook(lambda m, i, out: stats["residual"].append(_rms(out))))
        hooks.append(block.attn_norm.register_forward_hook(lambda m, i, out: stats["attn_in"].append(_rms(out))))
        hooks.append(block.mlp_norm.register_forward_hook(lambda m, i, out: stats["mlp_in"].append(_rms(out))))
        hooks += hook_attention_logits(block.attn, lambda logits: stats["attn_logits"].append(_rms(logits)), rows=1)
    try:
        forward() if forward is not None else model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    return stats


# ---- how far each block's weights moved: the update size along the real schedule --------------------------

def block_weights(model: torch.nn.Module) -> List[torch.Tensor]:
    """Each block's matrices, flattened into one fp32 copy in host memory (norm gains and biases left out)."""
    return [torch.cat([p.detach().float().flatten().cpu() for p in block.parameters() if p.ndim >= 2])
            for block in model.layers]


def weight_change(before: List[torch.Tensor], now: List[torch.Tensor]) -> tuple:
    """([|W - W_before| / |W_before| per block], now): the relative change since `before` (Frobenius norms)."""
    return [float((b - a).norm() / a.norm().clamp_min(1e-30)) for a, b in zip(before, now)], now
