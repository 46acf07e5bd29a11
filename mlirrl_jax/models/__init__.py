"""Whole models from PyTorch and ONNX: imported (lowered by torch-mlir in a child process, cut
into one program per layer, checked against the model's own output) and optimized layer by
layer, the model's time composed and compared with PyTorch and XLA. Needs the `models` extra
for importing; the imported programs need nothing more than the core install."""

from mlirrl_jax.models.cut import ModelError
from mlirrl_jax.models.importer import ModelImport, import_model

__all__ = ["ModelError", "ModelImport", "import_model"]
