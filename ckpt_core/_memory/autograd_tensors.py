"""The simulated device's tensors: storages with reference counts over `CachingAllocator`.

A tensor is a size with a reference count: `Tensors.new` allocates its storage, the
last `drop` frees it, and a view holds its base's storage instead of one of its own.
While a checkpointed region is recomputed (`Sim` in ``autograd_sim``), the tensors it
makes are tracked as the region's locals, those made after its early stop get no
storage, and its mallocs and frees can be held back and replayed later.

Pure Python; sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ckpt_core._memory.allocator import CachingAllocator


@dataclass(slots=True)
class _Tensor:
    handle: tuple[int, int] | None  # None: never allocated (after a recompute's early stop)
    refs: int
    base: int | None = None  # a view's: the tensor whose storage it holds


@dataclass(slots=True)
class Tensors:
    """Storages by tensor id, their sizes, and the allocator that holds them."""

    allocator: CachingAllocator = field(default_factory=CachingAllocator)
    tensors: dict[int, _Tensor] = field(default_factory=dict)
    info: dict[int, tuple[int, bool]] = field(default_factory=dict)  # tid -> (bytes, grad)
    _next: int = 0
    _recomputing: bool = False
    _stopped: bool = False
    _locals: set[int] = field(default_factory=set)  # the recompute's live tensors
    _unwound: set[int] = field(default_factory=set)  # freed by the early stop
    # A recompute's mallocs and frees, held back while the region's last backward
    # functions run (`Sim._recompute`): (handle or placeholder, bytes; None for a free).
    _deferred: list[tuple[tuple[int, int], int | None]] | None = None
    _pending: list[int] = field(default_factory=list)  # tensors made while deferred

    def new(self, size: int, grad: bool = False) -> int:
        tid = self._next
        self._next += 1
        handle = None if self._stopped else self._malloc(size)
        if handle is not None and self._deferred is not None:
            self._pending.append(tid)
        self.tensors[tid] = _Tensor(handle, 1)
        self.info[tid] = (size, grad)
        if self._recomputing:
            self._locals.add(tid)
        return tid

    def drop(self, *tids: int) -> None:
        for tid in tids:
            if tid in self._unwound:  # the early stop already let this name go
                self._unwound.discard(tid)
                continue
            self._locals.discard(tid)
            self._release(tid)

    def _release(self, tid: int) -> None:
        """One reference fewer; at none the storage is freed (a view's: its base's reference)."""
        tensor = self.tensors[tid]
        tensor.refs -= 1
        if tensor.refs == 0:
            if tensor.handle is not None:
                self._free(tensor.handle)
            del self.tensors[tid]
            if tensor.base is not None:
                self._release(tensor.base)

    def _malloc(self, size: int) -> tuple[int, int]:
        if self._deferred is None:
            return self.allocator.malloc(size)
        placeholder = (-1, len(self._deferred))  # no real segment is negative
        self._deferred.append((placeholder, size))
        return placeholder

    def _free(self, handle: tuple[int, int]) -> None:
        if self._deferred is None:
            self.allocator.free(handle)
        else:
            self._deferred.append((handle, None))

    def _replay(self, events: list[tuple[tuple[int, int], int | None]]) -> None:
        """Make the held-back mallocs and frees, then point live tensors at their blocks."""
        real: dict[tuple[int, int], tuple[int, int]] = {}
        for handle, size in events:
            if size is None:
                self.allocator.free(real.pop(handle, handle))
            else:
                real[handle] = self.allocator.malloc(size)
        for tid in self._pending:
            tensor = self.tensors.get(tid)
            if tensor is not None and tensor.handle is not None:
                tensor.handle = real[tensor.handle]
        self._pending.clear()

    @property
    def recomputing(self) -> bool:
        """Whether a checkpointed region's forward is being replayed for its backward."""
        return self._recomputing

    def size(self, tid: int) -> int:
        return self.info[tid][0]

    def storage_bytes(self, tids: Iterable[int]) -> int:
        """Bytes of the storages ``tids`` hold: a view counts as its base, each base once."""
        bases = set()
        for tid in tids:
            root = tid
            while (base := self.tensors[root].base) is not None:
                root = base
            bases.add(root)
        return sum(self.size(tid) for tid in bases)

    def requires_grad(self, tid: int) -> None:
        self.info[tid] = (self.info[tid][0], True)

    def hold(self, tid: int) -> int:
        """One more reference to ``tid`` (a holder the replay does not name), dropped later."""
        self.tensors[tid].refs += 1
        return tid

    def _view(self, base: int, size: int, grad: bool) -> int:
        tid = self._next
        self._next += 1
        self.tensors[base].refs += 1
        self.tensors[tid] = _Tensor(None, 1, base)
        self.info[tid] = (size, grad)
        if self._recomputing:
            self._locals.add(tid)
        return tid
