"""Run under `torchrun --nproc_per_node=1` on a CUDA machine (tests/test_cuda.py): FSDP2 with the bf16
mixed-precision policy over NCCL trains CausalLMLoss like the unwrapped module does, eager and compiled."""

import json
import sys

import torch

from model import ModelConfig, Transformer
from training import distributed as D
from training.checkpoint import full_model_state
from training.loop import CausalLMLoss, CompiledLoss

STEPS = 8


def losses(parallel: str, info: D.DistInfo, compiled: bool = False) -> list:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, hidden_size=128, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    raw = Transformer(cfg).to(info.device)
    module = D.wrap_model(CausalLMLoss(raw), raw.layers, parallel, info, "bf16")
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    call = CompiledLoss(module, warn=lambda message: print(message, file=sys.stderr)) if compiled else module
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 512, (8, 64), generator=gen).to(info.device) for _ in range(2))
    out = []
    for _ in range(STEPS):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=parallel != "fsdp"):  # FSDP2 casts itself
            loss = call(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.append(loss.item())
    state = full_model_state(module)  # collective: every rank; unsharded fp32 tensors on the CPU
    assert all(t.device.type == "cpu" for t in state.values()), "the full state dict must be on the CPU"
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point()), "fp32 master weights"
    if compiled:
        assert getattr(call, "failed", None) is None, f"compile fell back to eager: {call.failed}"
    return out


def main() -> None:
    info = D.process_info("cuda")
    # D.join skips the process group for a single process; FSDP2 needs one (a 1-rank NCCL mesh).
    torch.distributed.init_process_group(backend="nccl", device_id=info.device)
    try:
        result = {
            "plain": losses("none", info),
            "fsdp": losses("fsdp", info),
            "fsdp_compiled": losses("fsdp", info, compiled=True),
        }
    finally:
        D.teardown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
