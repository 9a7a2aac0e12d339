"""Torch model definitions. Importing this package imports no torch; the classes load lazily."""

from localradix.models.config import ModelConfig, RopeScaling
from localradix.models.registry import MODEL_REGISTRY, get_model_class, is_supported

__all__ = ["MODEL_REGISTRY", "ModelConfig", "RopeScaling", "get_model_class", "is_supported"]
