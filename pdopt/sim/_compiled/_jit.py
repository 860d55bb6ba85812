"""How the compiled engine's functions are compiled, and the shared closed forms compiled."""

from __future__ import annotations

import hashlib
import types
from pathlib import Path
from typing import Any

from llvmlite import ir as llvm_ir
from numba import njit
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.core.datamodel import models
from numba.core.datamodel.registry import default_manager
from numba.core.imputils import (
    impl_ret_borrowed,
    impl_ret_untracked,
    lower_getattr_generic,
    lower_setattr_generic,
)
from numba.core.types import unliteral
from numba.core.typing.templates import AttributeTemplate, infer_getattr
from numba.experimental import structref
from numba.extending import intrinsic, overload

from pdopt.cluster import _blocks
from pdopt.costmodel import _hybrid
from pdopt.model_spec import _coverage, _window
from pdopt.sim import _closed_form, _enums

# NOTE: a run's State crosses into compiled code once, as a tuple, and is passed on by
# reference (:func:`by_reference`). numba passes a tuple by value, as one argument per array
# field (~60 arrays of 7 words each here): measured on a chain of 30 small functions over a
# 60-array tuple, 72 s to compile and 15 µs a call chain, against 10 s and 2 µs by reference.
# A StructRef is reference counted, at every call and every field read: the functions get a
# plain view of it instead (:class:`StateView`, see :func:`_state_getattr`).
_plain_kernel = njit(cache=True)


def _unliteral_calls(dispatcher: Any) -> Any:
    """``dispatcher``, typing its calls from other compiled functions by the arguments' plain
    types.

    NOTE: numba types a constant argument (``LOG_PREEMPTION``, ``0``, ``False``) by its value,
    and a compiled caller's call compiles a specialization per value: measured, 124 extra
    compilations of the engine's functions, each linking and optimizing its callees again, ~75 s
    of the cold compile. Nothing here branches on a value's type, so one specialization per
    plain signature serves every call. Replaces the dispatcher's ``get_call_template`` (numba
    0.68's typing entry for a call from compiled code); the Python entry is unchanged.
    """
    template_for = dispatcher.get_call_template

    def get_call_template(args: tuple[Any, ...], kws: dict[str, Any]) -> Any:
        return template_for(
            tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()}
        )

    dispatcher.get_call_template = get_call_template
    return dispatcher


def kernel(function: Any) -> Any:
    """``function`` compiled for the engine (cached; calls typed by plain types, see above)."""
    return _unliteral_calls(_plain_kernel(function))


# NOTE: with reference counting on, a function counts each array it is passed in at the call and
# out at its end (numba's NRT_incref/NRT_decref: a call into numba's runtime each, atomic for an
# array that is not a borrowed State read, :func:`_state_getattr`); in the prefix cache's
# per-key loops, before State reads were borrowed, that counting was 37% of a prefix-caching
# run. A loop over many elements is therefore a *leaf*: it takes the arrays it touches as
# arguments and is compiled without reference counting (``_nrt=False``, a numba option its own
# test suite uses), which is sound because a leaf allocates nothing, keeps no array beyond the
# call and calls only leaves; its caller holds the arrays meanwhile. Tested with numba 0.68.
_plain_leaf = njit(cache=True, _nrt=False)  # type: ignore[call-overload]  # numba's stubs omit it


def leaf(function: Any) -> Any:
    """``function`` compiled as a leaf (see the note above): arrays and numbers in, no State."""
    return _unliteral_calls(_plain_leaf(function))


class StateRef(nbtypes.StructRef):
    """numba's type of a :class:`~pdopt.sim._compiled._state.State` held by reference: the same
    fields, read and written as ``s.name`` alike (see :func:`_state_getattr`)."""

    def preprocess_fields(self, fields: Any) -> tuple[tuple[str, Any], ...]:
        return tuple((name, unliteral(t)) for name, t in fields)


class StateView(nbtypes.Type):
    """numba's type of a State read through a plain pointer to a :class:`StateRef`'s fields:
    the same fields, read and written as ``s.name`` alike, and passed from function to function
    with nothing counted (``view_of``; the event loop holds the StructRef to its end).

    NOTE: passed as a StructRef, the State was counted in and out atomically at every call
    (numba's NRT_incref/NRT_decref on its memory info), as was every array read from it (see
    :func:`_state_getattr`): with both, a Phasor run at a 10 ms tick took 1.10 CPU s against
    3.07 s (the tune benchmark's hour of traffic, no time series), the same results."""

    def __init__(self, ref: StateRef) -> None:
        self.ref = ref
        super().__init__(name=f"StateView({ref})")

    @property
    def field_dict(self) -> Any:
        return self.ref.field_dict

    def get_data_type(self) -> Any:
        return self.ref.get_data_type()


class _StateViewModel(models.StructModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, [("data", nbtypes.voidptr)])


default_manager.register(StateRef, models.StructRefModel)
default_manager.register(StateView, _StateViewModel)

REPLACED_FIELDS = frozenset({"hidx", "lru", "logt", "logi", "eact", "eactf", "efin"})
"""The State's arrays that compiled code replaces during a run (``s.name = ...``): reading one
takes a counted reference, as numba's structref does."""


def _state_data(context: Any, builder: Any, typ: Any, val: Any) -> Any:
    """The fields of the State ``val`` (a StateRef's payload, or a StateView's), as a struct
    proxy."""
    if isinstance(typ, StateView):
        pointer = cgutils.create_struct_proxy(typ)(context, builder, value=val).data
    else:
        meminfo = cgutils.create_struct_proxy(typ)(context, builder, value=val).meminfo
        pointer = context.nrt.meminfo_data(builder, meminfo)
    payload = typ.get_data_type()
    pointer = builder.bitcast(
        pointer, context.data_model_manager[payload].get_value_type().as_pointer()
    )
    return cgutils.create_struct_proxy(payload)(context, builder, ref=pointer)


def _state_getattr(context: Any, builder: Any, typ: Any, val: Any, attr: str) -> Any:
    """``s.name``: the field as numba's structref reads it, but an array the run never replaces
    is handed out *borrowed*, with no memory-info pointer, so that nothing counts it in or out.

    NOTE: numba counts every array a function reads from a StructRef in and out with atomic
    instructions (NRT_incref/NRT_decref): with the StructRef's own counting at every call,
    measured, 73% of a Phasor run's CPU time at a 10 ms tick, and 17% of a prefix-caching one
    whose per-key loops were leaves already. A
    State array lives as long as the State, which outlives every compiled call of the run (the
    caller holds the tuple, the StructRef its fields), so a borrowed view of it cannot dangle;
    numba's counting functions skip a null memory-info pointer, as for arrays over foreign
    memory (``numba.carray``). The arrays that are replaced (:data:`REPLACED_FIELDS`) keep the
    counted read: a view of the old one must survive its replacement. Tested with numba 0.68."""
    data = _state_data(context, builder, typ, val)
    value = getattr(data, attr)
    fieldtype = typ.field_dict[attr]
    if not isinstance(fieldtype, nbtypes.Array) or attr in REPLACED_FIELDS:
        return impl_ret_borrowed(context, builder, fieldtype, value)
    array = context.make_array(fieldtype)(context, builder, value=value)
    array.meminfo = cgutils.get_null_value(array.meminfo.type)
    return impl_ret_untracked(context, builder, fieldtype, array._getvalue())


def _state_setattr(context: Any, builder: Any, sig: Any, args: Any, attr: str) -> None:
    """``s.name = value``: the new value counted in, the old one out (numba's structref). The
    engine's functions may replace only the arrays in :data:`REPLACED_FIELDS` (others are read
    borrowed; by_reference fills every field of the StructRef itself)."""
    typ, valtype = sig.args
    instance, value = args
    fieldtype = typ.field_dict[attr]
    array = isinstance(fieldtype, nbtypes.Array)
    if isinstance(typ, StateView) and array and attr not in REPLACED_FIELDS:
        raise TypeError(f"s.{attr} is read borrowed and must not be replaced: see REPLACED_FIELDS")
    data = _state_data(context, builder, typ, instance)
    cast = context.cast(builder, value, valtype, fieldtype)
    old = getattr(data, attr)
    context.nrt.incref(builder, fieldtype, cast)
    context.nrt.decref(builder, fieldtype, old)  # last: the new value may be the old one
    setattr(data, attr, cast)


for _typeclass in (StateRef, StateView):

    class _StateAttribute(AttributeTemplate):
        key = _typeclass

        def generic_resolve(self, typ: Any, attr: str) -> Any:  # type: ignore[override]
            return typ.field_dict.get(attr)

    infer_getattr(_StateAttribute)
    lower_getattr_generic(_typeclass)(_state_getattr)
    lower_setattr_generic(_typeclass)(_state_setattr)


def _view_of(typingctx: Any, ref: Any) -> Any:
    """``view_of(ref)``: a :class:`StateView` of the StructRef ``ref``, valid while ``ref``
    lives: the caller must end with ``keep(ref)``, or numba frees ``ref`` after its last use
    (this call) and the view dangles."""
    view = StateView(ref)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        meminfo = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
        out = cgutils.create_struct_proxy(sig.return_type)(context, builder)
        out.data = context.nrt.meminfo_data(builder, meminfo.meminfo)
        return out._getvalue()

    return view(ref), codegen


def _keep(typingctx: Any, ref: Any) -> Any:
    """``keep(ref)`` does nothing with ``ref``: a use that keeps it (and the views of it) alive
    to there."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return context.get_dummy_value()

    return nbtypes.none(ref), codegen


def _prefetch(typingctx: Any, array: Any, row: Any) -> Any:
    """``prefetch(array, row)``: a hint that ``array[row]`` will be read soon (the CPU fetches
    its cache line meanwhile; no effect on any value). ``row`` must be within the array."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        arraytype, rowtype = sig.args
        ary = context.make_array(arraytype)(context, builder, args[0])
        row = context.cast(builder, args[1], rowtype, nbtypes.intp)
        index = [row] + [context.get_constant(nbtypes.intp, 0)] * (arraytype.ndim - 1)
        pointer = cgutils.get_item_pointer(context, builder, arraytype, ary, index)
        byte = llvm_ir.IntType(8).as_pointer()
        i32 = llvm_ir.IntType(32)
        fnty = llvm_ir.FunctionType(llvm_ir.VoidType(), [byte, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(pointer, byte), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return nbtypes.none(array, row), codegen


view_of: Any = intrinsic(_view_of)  # compiled code only
keep: Any = intrinsic(_keep)
prefetch: Any = intrinsic(_prefetch)


def by_reference(state: Any) -> Any:
    """``state`` (a State tuple) as a :class:`StateRef` sharing its arrays; compiled code only."""
    raise NotImplementedError("by_reference runs in compiled code only")


@overload(by_reference)
def _by_reference(state: Any) -> Any:
    ref = StateRef(list(zip(state.fields, state.types, strict=True)))
    lines = ["def impl(state: Any):", "    s = new(ref)"]  # by_reference's signature
    lines += [f"    s.{name} = state.{name}" for name in state.fields]
    scope: dict[str, Any] = {"new": structref.new, "ref": ref}
    exec("\n".join([*lines, "    return s"]), scope)  # one assignment per field, as numba's own
    return scope["impl"]


def sources_digest() -> str:
    """A digest of every source the compiled engine is compiled from (see
    :func:`drop_stale_cache`)."""
    here = Path(__file__).parent
    sources = [*sorted(here.glob("*.py")), Path(_closed_form.__file__), Path(_enums.__file__)]
    # kv_blocks (re-exported by _closed_form), expert_coverage and window_held_tokens, compiled
    # with the leaves
    sources += [Path(_blocks.__file__), Path(_coverage.__file__), Path(_window.__file__)]
    sources += [Path(_hybrid.__file__)]  # fused_iteration_s, compiled by _mixed
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()


def drop_stale_cache() -> None:
    """Delete the engine's numba cache entries when any of its sources changed since they were
    written.

    NOTE: numba checks a cache entry against its own function's file only (a documented
    limitation), while a compiled caller embeds its callees: the package's functions call across
    its modules and into :mod:`pdopt.sim._closed_form` (and its
    :func:`~pdopt.model_spec.expert_coverage`), and freeze :mod:`pdopt.sim._enums`' values,
    so an edit to one of those would leave other modules' cached code stale. The entries are
    dropped together instead (numba recompiles, ~3 min). Only the in-tree cache (next to the
    sources, numba's default where it may write) is handled: elsewhere the sources are an
    installed copy, whose files all change together on an upgrade.
    """
    here = Path(__file__).parent
    digest = sources_digest()
    stamp = here / "__pycache__" / "sources.sha256"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass  # no stamp yet
    try:
        for cache in (here / "__pycache__", here.parent / "__pycache__"):
            prefix = "" if cache.parent == here else "_closed_form."
            for entry in cache.glob(f"{prefix}*.nb[ic]"):
                entry.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass  # not writable: numba caches elsewhere (see above)


drop_stale_cache()


def jit_leaves(module: types.ModuleType, names: tuple[str, ...]) -> tuple[Any, ...]:
    """``module``'s functions ``names``, compiled with :func:`kernel`, in that order.

    Each is compiled from the module's own code object, with its globals rebound so that a call
    from one leaf to another reaches the compiled version (numba cannot call plain Python
    functions). The module itself is left as it is: the Python engine keeps calling the plain
    functions, so both engines evaluate one source.
    """
    scope = dict(vars(module))
    for name in names:
        plain = getattr(module, name)
        copy = types.FunctionType(plain.__code__, scope, name, plain.__defaults__)
        copy.__qualname__ = plain.__qualname__
        scope[name] = kernel(copy)
    return tuple(scope[name] for name in names)


(
    expert_coverage,
    boundary_span,
    boundary_time,
    boundaries_before,
    first_boundary_after,
    first_growth_failure,
    growth,
    kv_blocks,
    kv_full_blocks,
    next_tick,
    segment_slopes,
    used_after,
    used_blocks,
    used_blocks_span,
    window_first_growth_failure,
    window_growth,
    window_held_tokens,
    window_used_blocks_span,
) = jit_leaves(
    _closed_form,
    (
        "expert_coverage",
        "boundary_span",
        "boundary_time",
        "boundaries_before",
        "first_boundary_after",
        "first_growth_failure",
        "growth",
        "kv_blocks",
        "kv_full_blocks",
        "next_tick",
        "segment_slopes",
        "used_after",
        "used_blocks",
        "used_blocks_span",
        "window_first_growth_failure",
        "window_growth",
        "window_held_tokens",
        "window_used_blocks_span",
    ),
)


@kernel
def full_blocks_of(s, tokens):
    """KV blocks a request holding ``tokens`` context tokens has filled completely in run ``s``
    (:func:`pdopt.sim._closed_form.kv_full_blocks`)."""
    return kv_full_blocks(tokens, s.bt, s.kv_window, s.kv_sliding_layers, s.kv_layers)


@kernel
def blocks_of(s, tokens):
    """KV blocks of a request holding ``tokens`` context tokens in run ``s``, the sliding window
    counted (:func:`pdopt.sim._closed_form.kv_blocks`; ClusterSpec.kv_blocks)."""
    return kv_blocks(tokens, s.bt, s.kv_window, s.kv_sliding_layers, s.kv_layers)
