"""What dtype did each op really compute in? A TorchDispatchMode that records every aten op with the
floating-point dtypes of its tensor inputs — below autocast, so it sees the casts autocast made."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# The ops a transformer's matmul FLOPs run in (forward and backward; linear decomposes into these).
MATMULS = ("mm", "addmm", "bmm", "baddbmm", "matmul")
ATTENTION = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
SOFTMAX_LOSS = ("_log_softmax", "nll_loss_forward", "nll_loss2d_forward")


class OpDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []  # (op name, (dtype of each floating input, …))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dtypes = tuple(
            t.dtype for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor) and t.is_floating_point()
        )
        self.calls.append((func.overloadpacket.__name__, dtypes))
        return func(*args, **(kwargs or {}))

    def dtypes_of(self, names: tuple) -> list:
        """The input dtypes of every call of an op in `names`, in order."""
        return [dtypes for name, dtypes in self.calls if name in names]
