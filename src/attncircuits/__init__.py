"""attncircuits: the helper package of *Transformer Circuits from Scratch*."""

from .model import ActivationCache, AttnOnlyConfig, AttnOnlyTransformer, loss_fn
from .pretrained import MODEL_NAMES, load_checkpoint, load_pretrained

__all__ = ["ActivationCache", "AttnOnlyConfig", "AttnOnlyTransformer", "MODEL_NAMES", "load_checkpoint", "load_pretrained", "loss_fn"]
__version__ = "0.1.0"
