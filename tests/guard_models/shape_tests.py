"""Tiny modules whose forward tests a dynamic size, for tests/test_guard_provenance.py (imported from this file's path:
the directory name is the package the harness locates frames in)."""

import torch


class BatchBranch(torch.nn.Module):
    """Exported at batch >= 8, the program keeps `batch >= 8` as a guard and refuses smaller batches."""

    def forward(self, x):
        y = x * 2
        if x.shape[0] >= 8:
            y = y + 1
        return y


class PinnedBatch(torch.nn.Module):
    """Exported at batch 4, the elif pins the batch to 4: a dynamic batch is refused at export."""

    def forward(self, x):
        if x.shape[0] > 9:
            return x + 2
        elif x.shape[0] == 4:
            return x - 1
        return x


class TrimmedBatch(torch.nn.Module):
    """No branch: exported at batch 10, the slice's bounds guard on `batch - 5 >= 0`, which eager does not need."""

    def forward(self, x):
        return x[: x.shape[0] - 5].sum(0)


class ShortPair(torch.nn.Module):
    """Exported at lengths (3, 4), the branch guards `len(x) + len(y) <= 8`; with `len(y) >= 2` (every dynamic dim's
    range) torch derives `len(x) <= 6`, so the program refuses (7, 1), where the guard itself holds."""

    def forward(self, x, y):
        if x.shape[0] + y.shape[0] <= 8:
            return x.sum(0) + y.sum(0)
        return x.sum(0) - y.sum(0)
