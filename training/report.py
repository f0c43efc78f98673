"""What the user reads at the start and the end of a run: the header (what will train, where, how) and
the summary (what it reached, how fast, where the files are)."""

from model.parametrization import describe
from training.budget import PROBE_STEPS, WARMUP_STEPS
from training.runtime.memory import memory_kind, peak_memory_bytes


def header(ctx) -> str:
    """The run's first lines: where it lives, the model, the data, the batch, the precision, the steps."""
    run, cfg, parts, data, info, state = ctx.run, ctx.cfg, ctx.parts, ctx.data, ctx.info, ctx.state
    tokens_per_step, peak, peak_source = ctx.tokens_per_step, ctx.peak, ctx.peak_source
    counts = parts.raw_model.param_counts()
    m = cfg.model
    return "\n".join([
        f"run dir: {run.run_dir}" + (f" (resuming {run.resume.path})" if run.resume else ""),
        *([run.init.describe()] if run.init and not run.resume else []),
        f"model: {m.norm} + {m.mlp}, hidden_size {m.hidden_size}, intermediate_size {m.resolved_intermediate_size}, "
        f"{m.depth}, parametrization {describe(m)}, {counts['total'] / 1e6:.2f}M parameters "
        f"(embedding {counts['embedding'] / 1e6:.2f}M, attention {counts['attention'] / 1e6:.2f}M, "
        f"mlp {counts['mlp'] / 1e6:.2f}M, norm {counts['norm'] / 1e3:.1f}K)",
        f"data: {data.meta['source']}: {data.meta['train_tokens']:,} train / {data.meta['val_tokens']:,} val tokens, "
        f"vocab {data.meta['vocab_size']}, cache {data.dir}",
        f"tokens per optimizer step: {cfg.trainer.micro_batch_size} micro batch × {cfg.trainer.seq_len} seq_len × "
        f"{cfg.trainer.grad_accum_steps} accumulation × {info.world_size} processes = {tokens_per_step:,}",
        f"{info.device}, {parts.precision} ({parts.notes[0]}), parallel={parts.parallel}, compile: {parts.notes[1]}",
        f"MFU peak {peak / 1e12:.2f} TFLOP/s ({peak_source}), steps {state.step}→{_end(cfg, state)}",
    ])


def _end(cfg, state) -> str:
    """The last step, and which setting decides it (docs/training.md: the rule for the length settings)."""
    trainer = cfg.trainer
    limits = [plan["limit"] for plan in state.plans if plan.get("limit")]
    budget = f"trainer.time_budget={trainer.time_budget:g} min" if trainer.time_budget else ""
    if budget and limits:
        first = [plan for plan in state.plans if not plan.get("limit")]
        when = (f"planned {len(first)} time{'s' * (len(first) > 1)} so far, again from step "
                f"{state.step + WARMUP_STEPS + PROBE_STEPS}" if first else
                f"the budget's first plan after step {state.step + WARMUP_STEPS + PROBE_STEPS}, then at every evaluation "
                "and as the end nears")
        return f"{state.max_steps} ({budget} or {limits[0]}, whichever comes first: {when})"
    if budget and state.plans:
        return (f"{state.max_steps} (planned by {budget}, {len(state.plans)} "
                f"plan{'s' * (len(state.plans) > 1)} so far; planned again from step {state.step + WARMUP_STEPS + PROBE_STEPS})")
    if budget:
        return (f"? ({budget} decides: a first plan after step "
                f"{state.step + WARMUP_STEPS + PROBE_STEPS}, then again at every evaluation and as the end nears)")
    if trainer.max_epochs and trainer.max_steps != state.max_steps and cfg.data.sampling == "epochs":
        return f"{state.max_steps} (trainer.max_epochs={trainer.max_epochs:g}: passes over every window)"
    if trainer.max_epochs and trainer.max_steps != state.max_steps:  # random windows: tokens drawn ÷ training tokens
        return f"{state.max_steps} (trainer.max_epochs={trainer.max_epochs:g} epoch-equivalents of random windows)"
    return f"{state.max_steps} (trainer.max_steps)"


def summary(outcome, run_dir, device) -> str:
    """The end of a finished run: steps, tokens and time; final (and best) validation; peak memory; files."""
    state, ev, ckpt = outcome.state, outcome.last_eval, outcome.checkpoint
    wall_s = outcome.wall_s
    lines = [
        "",
        f"done: {state.step} steps, {outcome.tokens_run:,} tokens in {wall_s / 60:.1f} min "
        f"({outcome.tokens_run / max(wall_s, 1e-9):,.0f} tokens/s)",
        f"final val loss {ev['val_loss']:.4f} | perplexity {ev['val_ppl']:.2f} | bits per byte {ev['val_bpb']:.4f}",
    ]
    if state.stopped_early:
        lines.append(f"stopped early at step {state.step} of {state.max_steps}: no lower validation bpb in "
                     f"{state.evals_since_best} evaluations (trainer.early_stopping)")
    if state.best_step is not None and state.best_step != state.step:
        lines.append(f"best val bits per byte {state.best_val_bpb:.4f} at step {state.best_step}: "
                     f"{run_dir}/checkpoints/best (resume=best, generate.py best, evaluate.py best)")
    if state.budget_decided and outcome.limit:
        minutes, used = state.budget_minutes, state.elapsed_s()
        why = ("more passes over the same data stop lowering the validation loss" if "max_epochs" in outcome.limit
               else "the run ends at whichever comes first")
        lines.append(f"stopped at {outcome.limit}, after {used / 60:.2f} of trainer.time_budget={minutes:g} min: {why} "
                     "(docs/training.md)")
    elif state.budget_decided:
        minutes, used = state.budget_minutes, state.elapsed_s()
        lines.append(f"time budget {minutes:g} min: the training loop took {used / 60:.2f} min "
                     f"({used / (60 * minutes) - 1:+.1%}), {len(state.plans)} plans (state.json)")
    if state.skipped_steps:
        lines.append(f"skipped {state.skipped_steps} non-finite step(s) (trainer.skip_nonfinite_steps)")
    lines += [
        f"peak memory {peak_memory_bytes(device) / 2 ** 30:.2f} GiB ({memory_kind(device)})",
        f"checkpoint: {ckpt}",
        f"metrics:    {run_dir}/metrics.jsonl",
        f"generate:   python scripts/generate.py {ckpt} --prompt 'ROMEO:' --max-new-tokens 200",
    ]
    return "\n".join(lines)
