"""Lowering of the Kernel IR's arithmetic (a mixin of ``lower.KernelLowering``): binary and
unary operations as each target computes them (the host calls libm and fuses a * b + c; NVIDIA
uses its approximate ex2/lg2/sin/cos after range reduction), casts including bf16's rounding,
dp4a and bf16 pair packing, and subgroup shuffles and reductions."""

from __future__ import annotations

from llvmlite import ir as L

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.dtypes import DType
from ..kernel import ir as K
from .targets import Target

__all__ = ["ArithmeticLowering", "llvm_type", "mem_type"]

I1, I8, I32, I64 = L.IntType(1), L.IntType(8), L.IntType(32), L.IntType(64)
F32 = L.FloatType()
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def llvm_type(t: DType) -> L.Type:
    return {
        "f32": F32,
        "f64": L.DoubleType(),
        "f16": L.HalfType(),
        "bf16": L.IntType(16),  # bf16: its bits; casts convert
        "i32": I32,
        "i64": I64,
        "i8": I8,
        "u8": I8,
        "bool": I1,
    }[t.name]


def mem_type(t: DType) -> L.Type:
    return I8 if t == dt.boolean else llvm_type(t)


def _suffix(ty: L.Type) -> str:
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}[str(ty)]


class ArithmeticLowering:
    """Methods of the lowerer for arithmetic; they use its builder (``b``), target (``t``), kernel
    (``k``), intrinsics (``intrinsic``), builtins (``builtin``) and flags (``host``, ``in_index``)."""

    b: L.IRBuilder
    t: Target
    k: K.Kernel
    host: bool
    in_index: bool

    # how sin and cos are computed: reduced by 2 pi first where the target's own are accurate on
    # [-pi, pi] only (``sincos_reduced``); a target with faster ones overrides ``approx``
    sincos_reduced = False
    approx_ops: frozenset[str] = frozenset()  # of exp2, log2, sin, cos: those ``approx`` computes
    # exp and log by LLVM's own (the host's libm, SPIR-V's GLSL.std.450 Exp/Log) rather than
    # through exp2 and log2, as GPU targets compute them
    natural_exp = False

    def approx(self, op: str, x: L.Value) -> L.Value:
        """A target's fast f32 ``exp2``, ``log2``, ``sin`` or ``cos`` of ``x`` (``sin``/``cos``:
        ``x`` already reduced to [-pi, pi]), for the ops in ``approx_ops``."""
        raise NotImplementedError(op)

    def reduce_turns(self, a: L.Value, k: L.Value) -> L.Value:
        """``a - 2 pi k`` in two steps (Cody-Waite; k * 6.28125 is exact below 2**15 turns)."""
        b = self.b
        r = b.fsub(a, b.fmul(k, L.Constant(F32, 6.28125)))
        return b.fsub(r, b.fmul(k, L.Constant(F32, 0.0019353071795864769)))

    def copysign(self, y: L.Value, x: L.Value) -> L.Value:
        """``y`` (not negative) with the sign of ``x``."""
        b = self.b
        return b.select(b.fcmp_ordered("<", x, L.Constant(F32, 0.0)), b.fneg(y), y)

    def dot4_i8(self, a: L.Value, c: L.Value, acc: L.Value) -> L.Value:
        """acc + the dot product of the signed bytes of a and c, by byte arithmetic (targets with
        an instruction for it override this)."""
        b = self.b
        for i in range(4):
            up = L.Constant(I32, 24 - 8 * i)
            x = b.ashr(b.shl(a, up), L.Constant(I32, 24))
            y = b.ashr(b.shl(c, up), L.Constant(I32, 24))
            acc = b.add(acc, b.mul(x, y))
        return acc

    def pack_bf16x2(self, lo: L.Value, hi: L.Value) -> L.Value:
        """The nearest bf16 of each of two f32, ``lo`` in the low half of an i32, by integer
        arithmetic (targets with an instruction for it override this)."""
        b = self.b
        halves = []
        for v in (lo, hi):  # round to nearest even in 32-bit integers (SPIR-V here has no 16-bit type)
            bits = b.bitcast(v, I32)
            lsb = b.and_(b.lshr(bits, L.Constant(I32, 16)), L.Constant(I32, 1))
            halves.append(b.lshr(b.add(bits, b.add(L.Constant(I32, 0x7FFF), lsb)), L.Constant(I32, 16)))
        return b.or_(b.and_(halves[0], L.Constant(I32, 0xFFFF)), b.shl(halves[1], L.Constant(I32, 16)))

    def fcall(self, name: str, *args: L.Value) -> L.Value:
        ty = args[0].type
        return self.b.call(self.intrinsic(f"{name}.{_suffix(ty)}", ty, [ty] * len(args)), list(args))

    def binary(self, op: str, a: L.Value, c: L.Value, t: DType) -> L.Value:
        b = self.b
        if t.is_float:
            if op in K.CMP_OPS:
                return b.fcmp_ordered({"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op], a, c)
            if op == "pow":
                if self.host:
                    return self.fcall("llvm.pow", a, c)
                return self.unary("exp2", b.fmul(c, self.unary("log2", a, t)), t)
            fn = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv, "rem": b.frem}.get(op)
            if fn is not None:
                if self.host and op in ("add", "sub", "mul"):
                    return fn(a, c, flags=("contract",))  # numerics policy: the host fuses a * b + c into one FMA
                return fn(a, c)
            return self.fcall("llvm.minnum" if op == "min" else "llvm.maxnum", a, c)
        if op in K.CMP_OPS:
            sign = t != dt.u8
            pred = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op]
            return b.icmp_signed(pred, a, c) if sign else b.icmp_unsigned(pred, a, c)
        if op == "min":
            return b.select(b.icmp_signed("<", a, c), a, c)
        if op == "max":
            return b.select(b.icmp_signed(">", a, c), a, c)
        if op in ("add", "sub", "mul") and self.in_index:
            return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](a, c, flags=("nsw",))
        return {"add": b.add, "sub": b.sub, "mul": b.mul, "div": b.sdiv, "rem": b.srem, "and": b.and_, "or": b.or_, "xor": b.xor, "shl": b.shl, "shr": b.ashr}[
            op
        ](a, c)

    def unary(self, op: str, a: L.Value, t: DType) -> L.Value:
        b = self.b
        if op == "neg":
            return b.fneg(a) if t.is_float else b.neg(a)
        if op == "not":
            return b.not_(a)
        if op == "abs":
            return self.fcall("llvm.fabs", a) if t.is_float else b.select(b.icmp_signed("<", a, L.Constant(a.type, 0)), b.neg(a), a)
        one = L.Constant(a.type, 1.0)
        if op == "recip":
            return b.fdiv(one, a)
        if op == "sqrt":
            return self.fcall("llvm.sqrt", a)
        if op == "rsqrt":
            return b.fdiv(one, self.fcall("llvm.sqrt", a))
        if op == "floor":
            return self.fcall("llvm.floor", a)
        if op == "rint":  # to nearest, ties to even
            return self.fcall("llvm.rint", a)
        if op == "erf":
            return self._erf(a)
        gpu = not (self.host or self.natural_exp)
        if op in ("exp", "exp2"):
            x = b.fmul(a, L.Constant(a.type, LOG2E)) if op == "exp" else a
            if "exp2" in self.approx_ops:
                return self.approx("exp2", x)
            if self.host and op == "exp" and a.type == F32:
                return self.exp_f32(a)
            return self.fcall("llvm.exp2", x) if gpu or op == "exp2" else self.fcall("llvm.exp", a)
        if op in ("log", "log2"):
            if "log2" in self.approx_ops:
                y = self.approx("log2", a)
            elif gpu:
                y = self.fcall("llvm.log2", a)
            elif self.host and op == "log" and a.type == F32:
                return self.log_f32(a)
            else:
                return self.fcall("llvm.log" if op == "log" else "llvm.log2", a)
            return b.fmul(y, L.Constant(a.type, LN2)) if op == "log" else y
        if op in ("sin", "cos"):
            if self.sincos_reduced or op in self.approx_ops:
                # reduced by 2*pi first, so large angles (RoPE at long positions) keep about 1e-6
                # absolute error
                k = self.fcall("llvm.rint", b.fmul(a, L.Constant(F32, 0.15915494309189535)))
                r = self.reduce_turns(a, k)
                return self.approx(op, r) if op in self.approx_ops else self.fcall(f"llvm.{op}", r)
            return self.fcall(f"llvm.{op}", a)
        if op == "tanh":
            # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both tails, no libm call on any target
            e2 = self.unary("exp", b.fmul(a, L.Constant(a.type, 2.0)), t)
            return b.fsub(one, b.fdiv(L.Constant(a.type, 2.0), b.fadd(e2, one)))
        raise Refusal(f"kernel {self.k.name}", self.t.key, f"function {op} is not lowered")

    def exp_f32(self, x: L.Value) -> L.Value:
        """e^x in f32 arithmetic that vectorizes (a libm call per element does not): x = n ln2 + r
        with n = rint(x log2 e) and r reduced in two steps (Cody-Waite), e^r by Cephes' degree-7
        polynomial on |r| <= ln2 / 2 (evaluated in pairs), times 2^n as two powers of two built from their bits (so n
        down to -150 gives subnormals). Within 2 ulp of the correctly rounded result; e^x past
        88.72 is inf, below -103.97 is 0, NaN stays NaN."""
        b = self.b
        c = lambda v: L.Constant(F32, v)  # noqa: E731
        xc = self.fcall("llvm.minnum", self.fcall("llvm.maxnum", x, c(-104.0)), c(89.0))
        n = self.fcall("llvm.rint", b.fmul(xc, c(LOG2E)))
        r = self.fcall("llvm.fma", n, c(-0.693359375), xc)  # ln 2 = 0.693359375 - 2.12194440e-4 (the first exact in 9 bits)
        r = self.fcall("llvm.fma", n, c(2.12194440e-4), r)
        # 1 + r + r^2 (c2 + c3 r + r^2 (c4 + c5 r + r^2 (c6 + c7 r))): pairs first (Estrin), so the
        # chain a scalar loop waits on is short
        fma = lambda x, y, z: self.fcall("llvm.fma", x, y, z)  # noqa: E731
        r2 = b.fmul(r, r)
        q01 = fma(c(1.6666665459e-1), r, c(5.0000001201e-1))
        q23 = fma(c(8.3334519073e-3), r, c(4.1665795894e-2))
        q45 = fma(c(1.9875691500e-4), r, c(1.3981999507e-3))
        q = fma(fma(q45, r2, q23), r2, q01)
        p = fma(q, r2, b.fadd(r, c(1.0)))
        ni = b.fptosi(n, I32)
        half = b.ashr(ni, L.Constant(I32, 1))
        pow2 = lambda e: b.bitcast(b.shl(b.add(e, L.Constant(I32, 127)), L.Constant(I32, 23)), F32)  # noqa: E731
        y = b.fmul(b.fmul(p, pow2(half)), pow2(b.sub(ni, half)))
        y = b.select(b.fcmp_ordered(">", x, c(88.72283935546875)), c(float("inf")), y)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def log_f32(self, x: L.Value) -> L.Value:
        """ln x in f32 arithmetic that vectorizes (a libm call per element does not): x = m 2^e
        from its bits (subnormals scaled by 2^25 first) with m in [sqrt(1/2), sqrt(2)), ln m by
        Cephes' degree-9 polynomial in f = m - 1 (evaluated in pairs), e ln 2 added in two parts.
        Within 2 ulp of the correctly rounded result; ln 0 is -inf, ln of a negative number NaN,
        ln inf inf, NaN stays NaN."""
        b = self.b
        c = lambda v: L.Constant(F32, v)  # noqa: E731
        i = lambda v: L.Constant(I32, v)  # noqa: E731
        fma = lambda x, y, z: self.fcall("llvm.fma", x, y, z)  # noqa: E731
        tiny = b.fcmp_ordered("<", x, c(1.1754943508222875e-38))
        xs = b.select(tiny, b.fmul(x, c(33554432.0)), x)  # 2^25: a subnormal becomes normal
        bits = b.bitcast(xs, I32)
        e = b.sub(b.and_(b.ashr(bits, i(23)), i(255)), b.select(tiny, i(126 + 25), i(126)))
        m = b.bitcast(b.or_(b.and_(bits, i(0x007FFFFF)), i(0x3F000000)), F32)  # [0.5, 1)
        low = b.fcmp_ordered("<", m, c(0.707106781186547524))
        e = b.sub(e, b.select(low, i(1), i(0)))
        f = b.fsub(b.select(low, b.fadd(m, m), m), c(1.0))
        z = b.fmul(f, f)
        p01 = fma(c(-2.4999993993e-1), f, c(3.3333331174e-1))
        p23 = fma(c(-1.6668057665e-1), f, c(2.0000714765e-1))
        p45 = fma(c(-1.2420140846e-1), f, c(1.4249322787e-1))
        p67 = fma(c(-1.1514610310e-1), f, c(1.1676998740e-1))
        p = fma(fma(fma(fma(c(7.0376836292e-2), z, p67), z, p45), z, p23), z, p01)
        ef = b.sitofp(e, F32)
        y = fma(b.fmul(p, f), z, b.fmul(ef, c(-2.12194440e-4)))
        y = fma(z, c(-0.5), y)
        y = fma(ef, c(0.693359375), b.fadd(f, y))
        y = b.select(b.fcmp_ordered("==", x, c(0.0)), c(float("-inf")), y)
        y = b.select(b.fcmp_ordered("==", x, c(float("inf"))), x, y)
        return b.select(b.fcmp_unordered("uno", x, x), x, b.select(b.fcmp_ordered("<", x, c(0.0)), c(float("nan")), y))

    def _erf(self, x: L.Value) -> L.Value:
        """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
        b, t = self.b, dt.f32
        ax = self.fcall("llvm.fabs", x)
        tt = b.fdiv(L.Constant(F32, 1.0), b.fadd(L.Constant(F32, 1.0), b.fmul(L.Constant(F32, 0.3275911), ax)))
        poly = L.Constant(F32, 1.061405429)
        for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            poly = b.fadd(b.fmul(poly, tt), L.Constant(F32, c))
        poly = b.fmul(poly, tt)
        y = b.fsub(L.Constant(F32, 1.0), b.fmul(poly, self.unary("exp", b.fneg(b.fmul(ax, ax)), t)))
        return self.copysign(y, x)

    def cast(self, v: L.Value, src: DType, dst: DType) -> L.Value:
        b = self.b
        if src == dst:
            return v
        to = llvm_type(dst)
        if src == dt.bf16:  # the upper half of an f32
            return self.cast(b.bitcast(b.shl(b.zext(v, I32), L.Constant(I32, 16)), F32), dt.f32, dst)
        if dst == dt.bf16:  # round to nearest even, keep the upper half
            bits = b.bitcast(self.cast(v, src, dt.f32), I32)
            lsb = b.and_(b.lshr(bits, L.Constant(I32, 16)), L.Constant(I32, 1))
            rounded = b.lshr(b.add(bits, b.add(L.Constant(I32, 0x7FFF), lsb)), L.Constant(I32, 16))
            return b.trunc(rounded, to)
        if dst == dt.boolean:
            return b.fcmp_unordered("!=", v, L.Constant(v.type, 0.0)) if src.is_float else b.icmp_unsigned("!=", v, L.Constant(v.type, 0))
        if src.is_float and dst.is_float:
            return b.fpext(v, to) if dst.bits > src.bits else b.fptrunc(v, to) if dst.bits < src.bits else b.fptrunc(b.fpext(v, F32), to)
        if src.is_float:
            return b.fptosi(v, to)
        if dst.is_float:
            return b.uitofp(v, to) if src in (dt.u8, dt.boolean) else b.sitofp(v, to)
        if dst.bits > src.bits or src == dt.boolean:
            return b.zext(v, to) if src in (dt.u8, dt.boolean) else b.sext(v, to)
        return b.trunc(v, to)

    def subgroup_reduce(self, op: str, v: L.Value, t: DType) -> L.Value:
        width = self.t.subgroup
        off = 1
        while off < width:
            other = self.shuffle(v, L.Constant(I32, off), t, xor=True)
            v = self.binary(op if op != "add" else "add", v, other, t)
            off *= 2
        return v

    def shuffle(self, v: L.Value, lane: L.Value, t: DType, xor: bool) -> L.Value:
        if self.host:
            return v  # one lane per subgroup
        return self.shuffle_word(v, lane, t, xor)

    def shuffle_word(self, v: L.Value, lane: L.Value, t: DType, xor: bool) -> L.Value:
        """A GPU target's subgroup shuffle of ``v`` (f32 or i32) from lane ``lane`` (or this lane
        xor ``lane``)."""
        raise Refusal(f"kernel {self.k.name}", self.t.key, "subgroup shuffles are not lowered for this target")
