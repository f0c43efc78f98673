"""Scale-out on CPU with gloo: DDP equals one process with the same global batch, FSDP2 trains and
its checkpoint loads in one process, and resume under torchrun is exact."""
import pytest
import torch
from safetensors.torch import load_file

from tests.train_helpers import read_metrics, run_dirs, run_torchrun, run_train
from training.checkpoint import load_model

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data_cache")


def losses(run):
    return [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]


def final_weights(run, step):
    return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


def assert_close_runs(a, b, step, rtol=1e-4):
    assert losses(a) == pytest.approx(losses(b), rel=rtol)
    wa, wb = final_weights(a, step), final_weights(b, step)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-5, msg=k)


# fp32 so the only differences left are summation order; log every step to compare whole curves.
EXACT = ["trainer.precision=fp32", "trainer.max_steps=12", "trainer.log_interval=1", "trainer.eval_interval=12",
         "trainer.ckpt_interval=6"]


@pytest.mark.parametrize("accum", [1, 2])
def test_ddp_matches_one_process_with_the_same_global_batch(tmp_path, cache_dir, accum):
    run_train(tmp_path / "single", *EXACT, "trainer.micro_batch_size=8", f"trainer.grad_accum_steps={accum}",
              cache_dir=cache_dir)
    proc = run_torchrun(tmp_path / "ddp", 2, *EXACT, "trainer.micro_batch_size=4",
                        f"trainer.grad_accum_steps={accum}", cache_dir=cache_dir)
    assert "parallel=ddp" in proc.stdout and "× 2 processes" in proc.stdout
    (single,), (ddp,) = run_dirs(tmp_path / "single"), run_dirs(tmp_path / "ddp")
    assert_close_runs(single, ddp, step=12)


def test_fsdp_trains_and_its_checkpoint_loads_in_one_process(tmp_path, cache_dir):
    from model.generate import generate

    run_torchrun(tmp_path, 2, "trainer.parallel=fsdp", "trainer.max_steps=30", "trainer.eval_interval=10",
                 "trainer.log_interval=5", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    train_losses = losses(run)
    assert train_losses[-1] < train_losses[0] - 0.3
    evals = [r["val_loss"] for r in read_metrics(run) if r["kind"] == "eval"]
    assert evals[-1] < evals[0]
    model, tokenizer, _ = load_model(str(run / "checkpoints" / "step_0000030"))
    text = generate(model, tokenizer, ["ROMEO:"], max_new_tokens=8, temperature=0.0)[0]
    assert isinstance(text, str) and len(text) > 0


def test_resume_under_torchrun_is_exact(tmp_path, cache_dir):
    run_torchrun(tmp_path / "full", 2, *EXACT, cache_dir=cache_dir)
    run_torchrun(tmp_path / "part", 2, *EXACT, "trainer.stop_at_step=6", cache_dir=cache_dir)
    (part,) = run_dirs(tmp_path / "part")
    run_torchrun(tmp_path / "part", 2, f"resume={part}", cache_dir=cache_dir)
    (full,) = run_dirs(tmp_path / "full")
    assert losses(full) == losses(part)
    wf, wp = final_weights(full, 12), final_weights(part, 12)
    assert all(torch.equal(wf[k], wp[k]) for k in wf)


def test_fsdp_checkpoint_resumes_on_a_different_world_size(tmp_path, cache_dir):
    run_torchrun(tmp_path, 2, "trainer.parallel=fsdp", *EXACT, "trainer.stop_at_step=6", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    proc = run_train(tmp_path, f"resume={run}", cache_dir=cache_dir)
    assert "warning: resuming a 2-process run on 1" in proc.stdout
    assert (run / "checkpoints" / "step_0000012").exists()
