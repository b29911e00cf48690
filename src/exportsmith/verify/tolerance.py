"""How far an exported program's outputs may be from eager's: rounding, far below a wrong branch or mask.

Exported programs run the same float32 kernels as eager, but decompositions and shape-dependent kernel choices may
reorder reductions, and a program may attend over keys it masks out where eager leaves them out. Such rounding is
relative to the size of what is summed: the absolute bound that suits tiny random models (outputs of order 1) is too
tight at real widths, where Mistral-7B's logits reach 5.4 and its step past the 4096-token window differs from eager
by 1.5e-5 (`scaled_dot_product_attention` alone, 4096 keys against 4102 with 6 masked: 6.7e-7 of its output's
scale). The bound is torch.testing's for float32, `ATOL + RTOL * |eager|`, taken norm-wise: |eager| is the largest
finite |value| of the case's outputs (an output's rounding error scales with the whole vector it came from, not
with each element, so a small logit beside large ones gets the same bound).
"""

import math

import torch

ATOL = 1e-5
RTOL = 1.3e-6  # torch.testing.assert_close's float32 rtol


def allowed(tensors: list[torch.Tensor]) -> float:
    """The largest |difference| from `tensors` (a case's eager outputs) that is rounding."""
    largest = 0.0
    for tensor in tensors:
        if tensor.numel() and (tensor.is_floating_point() or tensor.is_complex()):
            finite = tensor.abs()[torch.isfinite(tensor.abs())]
            if finite.numel():
                largest = max(largest, finite.max().item())
    return ATOL + RTOL * largest if math.isfinite(largest) else ATOL
