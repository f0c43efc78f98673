"""Interoperability with Hugging Face transformers: export checkpoints as LlamaForCausalLM, import them back."""
from interop.hf import ConversionError, from_hf_state_dict, llama_config, model_config_from_hf, to_hf_state_dict
from interop.hf_export import export_checkpoint
from interop.hf_import import import_checkpoint

__all__ = ["ConversionError", "export_checkpoint", "from_hf_state_dict", "import_checkpoint", "llama_config",
           "model_config_from_hf", "to_hf_state_dict"]
