"""Kernels run on CPU tensors through the Triton interpreter: set it before Triton is imported.

The interpreter computes bf16 wrongly, which is why every kernel upcasts to fp32 inside.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
