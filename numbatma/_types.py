"""Numba types and data models for numbatma values seen inside kernels.

* :class:`SharedArray` - the type numbatma gives ``cuda.shared.array(...)`` results, so TMA operations can
  insist at typing time that their shared-memory operand really is shared memory.
* :class:`TensorMapType` - a TMA descriptor. Its key holds every compile-time fact (rank, dtype, box,
  element strides, swizzle, interleave, float8 element), so device code can use ``desc.box_bytes`` as a constant.
  Inside a kernel the value is a generic pointer to the 128-byte ``CUtensorMap``; as a kernel parameter
  it is passed by value (``.param .align 128 .b8 p[128]``, ``__grid_constant__``).
* :class:`TensorMapArrayType` - many descriptors of one layout in global memory.
* :class:`MBarrierRefType` - one mbarrier in shared memory, as its 32-bit shared-window address.
"""
from __future__ import annotations

import math

from llvmlite import ir
from numba.cuda import types
from numba.cuda.datamodel import models
from numba.cuda.extending import register_model

from ._shapes import tile_footprint

# The LLVM struct behind every by-value descriptor parameter. The kernel-parameter hook in
# _numba_internals recognises descriptor parameters by this exact (identified) struct type.
CUTENSORMAP_STRUCT = ir.global_context.get_identified_type("struct.numbatma.CUtensorMap")
if CUTENSORMAP_STRUCT.is_opaque:
    CUTENSORMAP_STRUCT.set_body(ir.ArrayType(ir.IntType(64), 16))
CUTENSORMAP_PTR = CUTENSORMAP_STRUCT.as_pointer()


class SharedArray(types.Array):
    """A Numba array known to live in shared memory (``cuda.shared.array``).

    ``shape`` is the static shape when it is known (the array straight from ``cuda.shared.array``), else
    ``None``. Slicing and indexing keep the shared-memory marker (``copy`` is overridden) but drop the
    static shape, so ``stages[s]`` of a 3-D shared buffer is still a shared array.
    """

    def __init__(self, dtype, ndim, layout, readonly=False, aligned=True, shape=None, alignment=None):
        self.static_shape = None if shape is None else tuple(int(s) for s in shape)
        #: ``alignment=`` of the ``cuda.shared.array`` call (bytes), when the array comes straight from it
        self.declared_alignment = None if alignment is None else int(alignment)
        shape_txt = "" if shape is None else f", shape={self.static_shape}"
        align_txt = "" if alignment is None else f", alignment={self.declared_alignment}"
        name = f"shared array({dtype}, {ndim}d, {layout}{shape_txt}{align_txt})"
        super().__init__(dtype, ndim, layout, readonly=readonly, name=name, aligned=aligned)

    @property
    def key(self):
        return super().key + (self.static_shape, self.declared_alignment)

    def copy(self, dtype=None, ndim=None, layout=None, readonly=None):
        return SharedArray(
            dtype=self.dtype if dtype is None else dtype,
            ndim=self.ndim if ndim is None else ndim,
            layout=self.layout if layout is None else layout,
            readonly=(not self.mutable) if readonly is None else readonly,
            aligned=self.aligned,
        )

    def unify(self, typingctx, other):
        res = super().unify(typingctx, other)
        if isinstance(other, SharedArray) and isinstance(res, types.Array):
            shape = self.static_shape if self.static_shape == other.static_shape else None
            return SharedArray(res.dtype, res.ndim, res.layout, readonly=not res.mutable, aligned=res.aligned,
                               shape=shape)
        return res

    @property
    def nbytes(self):
        """Static size in bytes, or None when the shape is not known at compile time."""
        if self.static_shape is None:
            return None
        return math.prod(self.static_shape) * (self.dtype.bitwidth // 8)


register_model(SharedArray)(models.ArrayModel)


def _ceil_div(a, b):
    return -(-a // b)


class TensorMapType(types.Type):
    """Numba type of a tiled TMA descriptor.

    Parameters are in the array's own (row-major) index order; ``dtype`` is the Numba dtype the shared tile
    must have; ``tma_dtype`` the driver's element type name (e.g. ``"TFLOAT32"``).
    """

    def __init__(self, dtype, tma_dtype, box, element_strides, swizzle, interleave, store_overhang=0,
                 allow_store_overhang=False, element=None):
        self.dtype = dtype
        # "e4m3" / "e5m2": float8 data (TMA moves the bytes as UINT8; wgmma reads them as this element)
        self.element = element
        self.tma_dtype = tma_dtype
        self.box = tuple(int(b) for b in box)
        self.element_strides = tuple(int(e) for e in element_strides)
        self.swizzle = int(swizzle)
        self.interleave = int(interleave)
        # Bytes a store reaching a row's end writes past it (TensorMap.store_overhang), and whether the user
        # allowed that; tile stores/reduces through a descriptor with an unallowed overhang are typing errors.
        self.store_overhang = int(store_overhang)
        self.allow_store_overhang = bool(allow_store_overhang) and self.store_overhang > 0
        extra = ""
        if any(e != 1 for e in self.element_strides):
            extra += f", element_strides={self.element_strides}"
        if self.interleave:
            extra += f", interleave={self.interleave}B"
        if tma_dtype.startswith("TFLOAT32"):
            extra += ", tf32"
        if element is not None:
            extra += f", {element}"
        if self.store_overhang:
            extra += f", rows end {self.store_overhang} bytes short of 16" + (
                " (overhang allowed)" if self.allow_store_overhang else "")
        super().__init__(name=f"TensorMap({dtype}, box={self.box}, swizzle={self.swizzle}B{extra})")

    @property
    def key(self):
        return (self.dtype, self.tma_dtype, self.box, self.element_strides, self.swizzle, self.interleave,
                self.store_overhang, self.allow_store_overhang, self.element)

    @property
    def rank(self):
        return len(self.box)

    @property
    def itemsize(self):
        return self.dtype.bitwidth // 8

    @property
    def shared_shape(self):
        """Shape (row-major) of the shared-memory tile one load occupies: the box traversed with its element
        strides, ``ceil(box[i] / element_strides[i])`` elements along each axis; rows narrower than the
        swizzle span take a whole span (``numbatma.tensormap.tile_footprint``)."""

        return tile_footprint(self.box, self.element_strides, self.itemsize, self.swizzle)[0]

    @property
    def box_bytes(self):
        """Bytes one tile load writes to shared memory (= the mbarrier transaction count it completes)."""

        return tile_footprint(self.box, self.element_strides, self.itemsize, self.swizzle)[1]


class TensorMapModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, CUTENSORMAP_PTR)


register_model(TensorMapType)(TensorMapModel)


class TensorMapArrayType(types.Type):
    """Numba type of an array of same-layout descriptors in global memory (passed as its address)."""

    def __init__(self, element):
        self.element = element
        super().__init__(name=f"TensorMapArray({element})")

    @property
    def key(self):
        return self.element


class _U64Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.IntType(64))


class _U32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.IntType(32))


register_model(TensorMapArrayType)(_U64Model)


class MBarrierRefType(types.Type):
    """One mbarrier object in shared memory, held as its 32-bit shared-window address."""

    def __init__(self):
        super().__init__(name="mbarrier")


mbarrier_ref = MBarrierRefType()
register_model(MBarrierRefType)(_U32Model)


def register_constant_attributes(type_cls, attrs):
    """Attributes ``attrs`` of kernel values of ``type_cls`` are compile-time constants read from the type
    (ints, or tuples of ints), e.g. ``desc.box_bytes``."""
    from numba.cuda.core.imputils import lower_getattr
    from numba.cuda.typing.templates import AttributeTemplate, infer_getattr

    def numba_type_of(value):
        if isinstance(value, tuple):
            return types.UniTuple(types.intp, len(value))
        return types.intp

    @infer_getattr
    class ConstantAttributes(AttributeTemplate):
        key = type_cls

        def generic_resolve(self, desc, attr):
            if attr in attrs:
                return numba_type_of(getattr(desc, attr))

    def make_lowering(attr):
        def lower(context, builder, ty, value):
            const = getattr(ty, attr)
            return context.get_constant_generic(builder, numba_type_of(const), const)

        lower_getattr(type_cls, attr)(lower)

    for attr in attrs:
        make_lowering(attr)


# ``desc.box_bytes``, ``desc.rank``, ``desc.box``, ``desc.shared_shape`` as compile-time constants.
register_constant_attributes(TensorMapType, ("box_bytes", "rank", "box", "shared_shape"))
