"""`init_from=`, at the edge: a new run that starts from the weights of a minillama checkpoint (a path, a run
directory, `latest`, `best`) or of a Hugging Face Llama directory (imported once into the data cache). The run's
model becomes the checkpoint's architecture (model.* overrides on top may change only what shapes no weight) and
its data is read with the checkpoint's tokenizer; everything else — data, optimizer, schedule, run directory —
is the new run's own (training/checkpoint/init_from.py)."""
import dataclasses
import sys
from typing import List

from omegaconf import DictConfig, OmegaConf, open_dict

from interop.hf_import import cached_import, is_hf_directory
from model import ModelConfig
from training.checkpoint.init_from import InitFrom


def start_from_weights(dict_cfg: DictConfig, overrides: List[str], say=print) -> InitFrom:
    """Open `dict_cfg.init_from`, and make `dict_cfg`'s model the checkpoint's (with the command line's
    model.* overrides) and its data.tokenizer_path the checkpoint's tokenizer (carried into the cache)."""
    source, verify = str(dict_cfg.init_from), dict_cfg.get("verify_checkpoint", True)
    warn = lambda message: print(message, file=sys.stderr)  # noqa: E731
    path = str(cached_import(source, dict_cfg.data.cache_dir, verify=verify)) if is_hf_directory(source) else source
    init = InitFrom.open(path, dict_cfg.outputs_dir, verify, source=source, warn=warn)
    groups = [o for o in overrides if o.split("=")[0] in ("model", "experiment")]
    if groups:
        say(f"init_from: the model comes from {init.path}; {' '.join(groups)} set the rest of the run only")
    model_overrides = [o[len("model."):] for o in overrides if o.startswith("model.")]
    with open_dict(dict_cfg):
        dict_cfg.model = OmegaConf.merge(OmegaConf.structured(ModelConfig), dataclasses.asdict(init.model),
                                         OmegaConf.from_dotlist(model_overrides))  # keys checked on the command line
        if any(o.startswith("data.tokenizer_path=") for o in overrides):
            init.check_tokenizer(dict_cfg.data.tokenizer_path)
        else:
            dict_cfg.data.tokenizer_path = str(init.carry_tokenizer(dict_cfg.data.cache_dir))
    return init
