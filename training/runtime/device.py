"""The one device picker: `auto`, `cpu`, `cuda`, `cuda:N` or `mps` → a torch.device that exists here."""
import torch

SUPPORTED = ("cpu", "cuda", "mps")


def pick_device(name: str, local_rank: int = 0, option: str = "trainer.device") -> torch.device:
    """`auto` prefers CUDA (this process's local rank under torchrun), then MPS, then the CPU.

    A device this machine lacks is a ValueError naming `option` (the flag or config key the user
    set) and the fix. A bare `cuda` means one GPU per local rank.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        return torch.device("mps" if _mps_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{option}={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in SUPPORTED:
        raise ValueError(f"{option}={name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{option}={name} but CUDA is not available on this machine; use {option}=cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"{option}={name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not _mps_available():
        raise ValueError(f"{option}={name} but MPS is not available on this machine; use {option}=cpu")
    return device


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
