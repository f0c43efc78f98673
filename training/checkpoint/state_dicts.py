"""Full (unsharded) state dicts keyed by parameter name — the checkpoint format at any world size.

Under torchrun, torch.distributed.checkpoint's state-dict API gathers FSDP shards and maps
optimizer state to parameter names. One process produces the very same format without it: the
API costs ~1.5 s of imports per start (DTensor, sympy), more than a small run's training.
"""
import torch
import torch.distributed as dist


def full_model_state(model: torch.nn.Module) -> dict:
    """The unsharded state dict of the (unwrapped) model (collective under FSDP: call on every rank)."""
    if not dist.is_initialized():
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(model, options=_full_options())


def full_optimizer_state(model: torch.nn.Module, optimizers: list) -> dict:
    """{"state": {name: {...}}, "param_groups": [{..., "params": [names]}]}: loads at any world size.
    Several optimizers (e.g. Muon + AdamW) merge into one dict: each parameter belongs to one."""
    if dist.is_initialized():
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        return get_optimizer_state_dict(model, optimizers, options=_full_options())
    names = _names(model)
    state, groups = {}, []
    for optimizer in optimizers:
        saved, params = optimizer.state_dict(), _params(optimizer)
        state.update({names[id(params[index])]: value for index, value in saved["state"].items()})
        for group, saved_group in zip(optimizer.param_groups, saved["param_groups"]):
            groups.append({**{k: v for k, v in saved_group.items() if k != "params"},
                           "params": [names[id(p)] for p in group["params"]]})
    return {"state": state, "param_groups": groups}


def load_full_state(model: torch.nn.Module, optimizers, model_state: dict, optim_state) -> None:
    if dist.is_initialized():
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_model_state_dict(model, model_state, options=opts)
        if optimizers is not None and optim_state is not None:
            set_optimizer_state_dict(model, optimizers, optim_state, options=opts)
        return
    model.load_state_dict(model_state)
    if optimizers is None or optim_state is None:
        return
    names = _names(model)
    saved_groups = {frozenset(g["params"]): g for g in optim_state["param_groups"]}
    for optimizer in optimizers:
        params, groups = _params(optimizer), []
        index = {id(p): i for i, p in enumerate(params)}
        for group in optimizer.param_groups:
            group_names = [names[id(p)] for p in group["params"]]
            saved = saved_groups.get(frozenset(group_names))
            if saved is None:
                raise ValueError("the checkpoint's optimizer state does not fit this optimizer (its parameter "
                                 "groups differ: another optim.name?); resume with the optimizer it was saved with")
            groups.append({**{k: v for k, v in saved.items() if k != "params"},
                           "params": [index[id(p)] for p in group["params"]]})
        state = {i: optim_state["state"][names[id(p)]] for i, p in enumerate(params) if names[id(p)] in optim_state["state"]}
        optimizer.load_state_dict({"state": state, "param_groups": groups})


def _names(model: torch.nn.Module) -> dict:
    """id(parameter) → its name (a tied parameter keeps its first name, as the state-dict API does)."""
    return {id(p): name for name, p in model.named_parameters()}


def _params(optimizer: torch.optim.Optimizer) -> list:
    """The optimizer's parameters in the order its state_dict() numbers them."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=True)
