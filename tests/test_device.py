"""training/distributed.py: the one device picker behind trainer.device and scripts' --device."""

import pytest
import torch

from training.distributed import pick_device


def test_auto_and_cpu():
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert pick_device("auto").type == expected
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize(
    "name, option, message",
    [
        ("tpu9", "trainer.device", "trainer.device='tpu9' is not a device; use auto, cpu, cuda, cuda:N or mps"),
        ("xpu", "--device", "--device='xpu' is not supported"),
    ],
)
def test_unknown_devices_name_the_option(name, option, message):
    with pytest.raises(ValueError) as err:
        pick_device(name, option=option)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_names_the_fix(name):
    message = f"--device={name} but CUDA is not available on this machine; use --device=cpu"
    with pytest.raises(ValueError, match=message):
        pick_device(name, option="--device")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bare_cuda_is_this_local_rank_and_a_missing_index_is_an_error():
    assert pick_device("cuda", local_rank=0) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="CUDA device"):
        pick_device(f"cuda:{torch.cuda.device_count()}")
