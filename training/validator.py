"""The loop's validator: every trainer.eval_interval steps and at the end, the validation loss, perplexity
and bits per byte (training/evaluation.py), per-layer activation RMS and a short sample; a new lowest bpb
becomes checkpoints/best."""
import torch

from training.activation_stats import activation_rms
from training.evaluation import Windows, evaluate


class Validator:
    def __init__(self, cfg, parts, windows, data, info, log, checkpointer, end: int):
        self.cfg, self.parts, self.data, self.info = cfg, parts, data, info
        self.windows = Windows.from_tiles(windows) if isinstance(windows, torch.Tensor) else windows
        self.log, self.checkpointer, self.end = log, checkpointer, end
        self.interval = cfg.trainer.eval_interval

    def should_validate(self, step: int) -> bool:
        return step % self.interval == 0 or step == self.end

    def validate(self, state) -> dict:
        parts, trainer = self.parts, self.cfg.trainer
        ev = evaluate(parts.compute_loss, self.windows, trainer.micro_batch_size, parts.autocast, self.data.meta,
                      self.info)
        if trainer.activation_rms:  # every rank runs it: under FSDP the forward has collectives
            ev["act_rms"] = self.activation_rms()
        self.log.log_eval(state.step, state.tokens_seen, ev)
        if trainer.sample_tokens > 0 and parts.parallel != "fsdp" and self.info.is_main:
            self.log.write(self.sample())
        if state.improves_best(ev["val_bpb"]) and trainer.keep_best:
            self.checkpointer.save_best(state)
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
        """A short sample from trainer.sample_prompt; its own seeded generator leaves training RNG untouched."""
        from data.tokenizer import read_special_tokens
        from model.generate import generate
        trainer, model = self.cfg.trainer, self.parts.raw_model
        model.eval()
        with self.parts.autocast():
            text = generate(model, self.data.tokenizer(), [trainer.sample_prompt], max_new_tokens=trainer.sample_tokens,
                            temperature=0.8, top_k=50, seed=self.cfg.seed,
                            eos_token=read_special_tokens(self.data.dir)["eos"])[0]
        model.train()
        return "---- sample ----\n" + trainer.sample_prompt + text + "\n----------------"
