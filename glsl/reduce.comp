#version 450
// DML_REDUCE_OPERATOR_DESC: each output element reduces the input elements that share
// its kept coordinates, k = 0 .. count-1 numbering them row-major over the reduced axes
// (the host merges neighbouring reduced axes that address as one: RDIMS of them left).
// FUNC is DML_REDUCE_FUNCTION's value.  Two ways over an output element:
//   GROUP false ("lane"): one invocation per output element over a box of the output
//          (the grid machinery of glsl/fold.comp), walking k in blocks of BLOCK.
//   GROUP true ("group"): one workgroup per output element; lane l takes k = l, l + L,
//          ... (L = LOCAL_SIZE_X), then the lanes' states combine in a shared-memory tree.
//   VEC4 1 ("vec4", kept): one invocation per 4 * KEPT neighbouring outputs along the
//          packed last axis (kept), reading KEPT 4-element texels / vec4s of them at each
//          reduced element: a lane reads 16 * KEPT contiguous bytes of each reduced row
//          (the CPU drivers run a SIMD group's lanes over every reduced row before the
//          next group: the longer each visit, the fewer row switches per byte).
//   VEC4 2 ("vec4", row): one invocation per output, the packed innermost reduced axis
//          read 4 elements a texel / vec4.  Both need 4-aligned strides (the host checks)
//          and the whole tensors bound; the lanes' grid is a flat range of units.
//   VEC4 3 ("vec4", span): one invocation per output whose reduced elements are one
//          packed run (one merged axis of unit stride) at any alignment and length (global
//          pooling's 7x7 = 49): the texels covering the run, the components outside it
//          left out.
// Numerics: float types accumulate in float32; a sum is blocked (partial sums of at most
// BLOCK terms, then the partials, and in GROUP a pairwise tree of the lanes), not one
// serial loop; LOG_SUM_EXP keeps a running maximum m and sum(exp(x - m)).  Integer sums
// and products wrap (two's complement, the same bits signed or unsigned).  MIN, MAX,
// ARGMIN, ARGMAX propagate the first NaN; ARGMIN/ARGMAX keep the first (smallest k)
// extreme on a tie and store k (OUT_INDEX 1: 32-bit, 2: 64-bit word pair).
//
// vkml:variant reduce_f32 F32=1
// vkml:variant reduce_f32_texel F32=1 TEXEL=1
// vkml:variant reduce_f32_texel4 F32=1 TEXEL4=1
// vkml:variant reduce_f32_ssbo4 F32=1 SSBO4=1
// vkml:variant reduce_f16 F16=1
// vkml:variant reduce_f16_packed F16_PACKED=1
// vkml:variant reduce_i8 INT_BITS=8 SIGNED=1
// vkml:variant reduce_u8 INT_BITS=8
// vkml:variant reduce_i16 INT_BITS=16 SIGNED=1
// vkml:variant reduce_u16 INT_BITS=16
// vkml:variant reduce_i32 INT_BITS=32 SIGNED=1
// vkml:variant reduce_u32 INT_BITS=32
// vkml:variant reduce_i64 INT64=1 SIGNED=1
// vkml:variant reduce_u64 INT64=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_elem.glsl"
#ifdef E_FLOAT
// egt / elt without the short-circuit branches of || and && (SwiftShader runs each as
// control flow under lane masks: a float MAX took 3x a SUM), the same order
#undef EGT
#undef ELT
bool gt_flat(float a, float b) { return any(bvec2(a > b, all(bvec2(isnan(a), !isnan(b))))); }
bool lt_flat(float a, float b) { return any(bvec2(a < b, all(bvec2(isnan(a), !isnan(b))))); }
#define EGT(a, b) gt_flat(a, b)
#define ELT(a, b) lt_flat(a, b)
#endif

#if defined(TEXEL4)
// float32 as RGBA32F texels (VEC4; the scalar paths' reads kept only so they compile)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define FETCH4(i) texelFetch(Xt, int(i))
#define XLOAD(i) FETCH4((i) >> 2)[(i) & 3u]
#elif defined(SSBO4)
// the same from a vec4 storage buffer (SwiftShader binds 65536 texels at most)
layout(std430, set = 0, binding = 0) readonly buffer In4 { vec4 x4[]; };
#define FETCH4(i) x4[i]
#define XLOAD(i) FETCH4((i) >> 2)[(i) & 3u]
#elif defined(TEXEL)
// float32 through an R32F uniform texel buffer: lavapipe vectorizes texel reads and
// runs storage-buffer reads one lane at a time (docs/DEVELOPING.md)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define XLOAD(i) texelFetch(Xt, int(i)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer In { E_T x[]; };
#define XLOAD(i) ELOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { E_T y[]; };
layout(std430, set = 0, binding = 1) buffer OutWords { uint yw[]; };   // ARGMIN/ARGMAX
layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension (kept axes; reduced ones 0)
    uvec4 out_size[2];            // GROUP: output sizes (reduced axes 1)
    uvec4 rsize[2];               // the merged reduced axes' sizes, innermost last
    uvec4 rstride[2];             // and input strides
    uvec4 rstep[2];               // GROUP: L as digits of the mixed radix rsize
    uint count;                   // elements reduced per output
    uint pad0, pad1, pad2;
};

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;
layout(constant_id = 2) const int XDIMS = 1;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: FUNC, RDIMS, OUT_INDEX, GROUP and VEC4 pick
// the function and path (unfrozen, SwiftShader runs all twelve functions and every path under
// lane masks).
// vkml:frozen FUNC RDIMS OUT_INDEX GROUP VEC4 KEPT SPAN KDIMS
layout(constant_id = 24) const int FUNC = 10;
layout(constant_id = 25) const int RDIMS = 1;
layout(constant_id = 26) const int OUT_INDEX = 0;
layout(constant_id = 27) const bool GROUP = false;
layout(constant_id = 28) const int VEC4 = 0;      // 1: kept, 2: row, 3: span (the top)
layout(constant_id = 29) const int KEPT = 1;      // VEC4 1: vec4s of outputs a lane holds
// VEC4 1: the elements of the one reduced axis; VEC4 2: the texels of a row where it is the
// one reduced axis; VEC4 3: the texels strictly between a run's first and last one where
// every run has as many (the host checks); all within one partial sum (BLOCK).  0: a loop
layout(constant_id = 30) const int SPAN = 0;
// VEC4: the kept axes of more than one element, merged where they address as one in both
// tensors (the host packs them last in out_size / in_stride / out_stride): the outermost
// takes the unit's quotient whole, the others a division each (lavapipe divides a vector
// one lane at a time; SwiftShader ran a branch per axis of the 8 under lane masks)
layout(constant_id = 31) const int KDIMS = 1;

layout(push_constant) uniform Push {
    uvec4 origin[2];              // GROUP: origin[0].x is the first output element
    uvec4 extent[2];
    uint in_base, out_base;
    uint x_count;
    uvec4 magic[2];
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]
const int ARGMAX = 0, ARGMIN = 1, AVERAGE = 2, L1 = 3, L2 = 4, LOG_SUM = 5,
          LOG_SUM_EXP = 6, MAX = 7, MIN = 8, MULTIPLY = 9, SUM = 10, SUM_SQUARE = 11;
const uint BLOCK = 256u;
const uint UNROLL = 4u;
const int LAST = RANK - 1;

// One reduction's state: a (the sum, product, extreme, or LOG_SUM_EXP's maximum),
// s (LOG_SUM_EXP's sum of exp(x - a)) and k (the extreme's index).
struct State { VAL a; float s; uint k; };

State initial() {
    State t;
    t.a = (FUNC == MAX || FUNC == ARGMAX || FUNC == LOG_SUM_EXP) ? ELOWEST :
          (FUNC == MIN || FUNC == ARGMIN) ? EHIGHEST : FUNC == MULTIPLY ? EONE : EZERO;
    t.s = 0.0;
    t.k = 0xFFFFFFFFu;
    return t;
}

#ifdef E_FLOAT
// exp(v - m) for v <= m, 1 where they are equal (infinities included)
float rel_exp(float v, float m) { return v == m ? 1.0 : exp(v - m); }
#endif

// t and u combined (u's indices come after t's for equal values unless GROUP).
State merge(State t, State u) {
    if (FUNC == ARGMAX || FUNC == ARGMIN) {
        bool better = FUNC == ARGMAX ? EGT(u.a, t.a) : ELT(u.a, t.a);
        bool tie = all(bvec3(!EGT(u.a, t.a), !ELT(u.a, t.a), u.k < t.k));
        return any(bvec2(better, tie)) ? u : t;
    }
    if (FUNC == MAX) return EGT(u.a, t.a) ? u : t;
    if (FUNC == MIN) return ELT(u.a, t.a) ? u : t;
    if (FUNC == MULTIPLY) { t.a = EMUL(t.a, u.a); return t; }
#ifdef E_FLOAT
    if (FUNC == LOG_SUM_EXP) {
        float m = any(bvec2(u.a > t.a, isnan(u.a))) ? u.a : t.a;
        t.s = t.s * rel_exp(t.a, m) + u.s * rel_exp(u.a, m);
        t.a = m;
        return t;
    }
#endif
    t.a = EADD(t.a, u.a);
    return t;
}

// One element v (index k) into state t.
State take(State t, VAL v, uint k) {
    State u;
    u.k = k;
    u.s = 1.0;
    u.a = v;
    if (FUNC == L1) u.a = EABS(v);
    if (FUNC == L2 || FUNC == SUM_SQUARE) u.a = EMUL(v, v);
    return merge(t, u);
}

uint rc[8];      // the reduced coordinates of the element being read

// rc += digits (each below its rsize): a mixed-radix add without divisions
void advance(uint digits[8]) {
    uint carry = 0u;
    [[unroll]] for (int d = RDIMS - 1; d >= 0; d--) {
        uint t = rc[d] + digits[d] + carry;
        carry = t >= AT(rsize, d) ? 1u : 0u;
        rc[d] = t - carry * AT(rsize, d);
    }
}

VAL element(uint base) {
    uint off = base;
    [[unroll]] for (int d = 0; d < RDIMS; d++) off += rc[d] * AT(rstride, d);
    return XLOAD(off);
}

// Elements k0, k0 + step, ... below `count` (rc at k0), UNROLL an iteration, folded into
// partial states of BLOCK elements.  One loop of at most count / (UNROLL * step)
// iterations: lavapipe ends a loop after 65535 iterations in all (an inner loop's count
// is not reset when it is entered again), so the host keeps count below UNROLL * 65535
// steps (LANE_MAX / GROUP_MAX in vkml/ops/reduce.py).
State walk(uint base, uint k0, uint step, uint digits[8]) {
    State total = initial();
    State part = initial();
    uint j = 0u;
    for (uint k = k0; k < count; k += UNROLL * step) {
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            uint kk = k + u * step;
            // rc stays within rsize (a carry out is dropped); one reduced axis needs no rc
            // (SwiftShader keeps that array in memory): k past count reads the last
            VAL v = RDIMS == 1 ? XLOAD(base + min(kk, count - 1u) * AT(rstride, 0))
                               : element(base);
            if (kk < count) part = take(part, v, kk);
            if (RDIMS > 1) advance(digits);
        }
        j += UNROLL;
        if (j >= BLOCK) {
            total = merge(total, part);
            part = initial();
            j = 0u;
        }
    }
    return merge(total, part);
}

void store(uint o, State t) {
    if (OUT_INDEX == 1) { yw[o] = t.k; return; }
    if (OUT_INDEX == 2) { yw[2u * o] = t.k; yw[2u * o + 1u] = 0u; return; }
#ifdef E_FLOAT
    float r = t.a;
    if (FUNC == AVERAGE) r = t.a / float(count);
    if (FUNC == L2) r = sqrt(t.a);
    if (FUNC == LOG_SUM) r = log(t.a);
    if (FUNC == LOG_SUM_EXP) r = isinf(t.a) ? t.a : t.a + log(t.s);
    FSTORE(y, o, r);
#else
    ESTORE(y, o, t.a);
#endif
}

uint coord[8];

uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

// GROUP: the lanes' states, combined pairwise
shared State lanes[gl_WorkGroupSize.x];

void main_group() {
    uint l = gl_LocalInvocationID.x;
    uint L = gl_WorkGroupSize.x;
    uint o = origin[0].x + gl_WorkGroupID.x;      // the output element, row-major
    uint base = 0u, out_off = 0u;
    [[unroll]] for (int d = LAST; d >= 0; d--) {  // uniform per workgroup
        uint c = o % AT(out_size, d);
        o /= AT(out_size, d);
        base += c * AT(in_stride, d);
        out_off += c * AT(out_stride, d);
    }
    uint rest = l;                                // rc = l's digits (once per lane)
    [[unroll]] for (int d = RDIMS - 1; d >= 0; d--) {
        rc[d] = rest % AT(rsize, d);
        rest /= AT(rsize, d);
    }
    uint digits[8];
    [[unroll]] for (int d = 0; d < 8; d++) digits[d] = d < RDIMS ? AT(rstep, d) : 0u;
    State t = l < count ? walk(base, l, L, digits) : initial();
    lanes[l] = t;
    barrier();
    for (uint s = L / 2u; s > 0u; s >>= 1) {
        if (l < s) lanes[l] = merge(lanes[l], lanes[l + s]);
        barrier();
    }
    if (l == 0u) store(out_off, lanes[0]);
}

void main_lane() {
    uint gx = gl_GlobalInvocationID.x;
    const int YDIM = RANK - XDIMS - 1;
    bool live = gx < x_count && (YDIM < 0 || gl_GlobalInvocationID.y < AT(extent, YDIM));
    uint z = gl_GlobalInvocationID.z;
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) coord[YDIM] = AT(origin, YDIM) + gl_GlobalInvocationID.y;
    [[unroll]] for (int d = LAST; d > YDIM; d--) {
        if (d == YDIM + 1) {
            coord[d] = AT(origin, d) + gx;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
    uint base = 0u, o = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        base += coord[d] * AT(in_stride, d);
        o += coord[d] * AT(out_stride, d);
    }
    [[unroll]] for (int d = 0; d < 8; d++) rc[d] = 0u;
    uint digits[8];
    [[unroll]] for (int d = 0; d < 8; d++) digits[d] = d == RDIMS - 1 ? 1u : 0u;
    State t = walk(live ? base - in_base : 0u, live ? 0u : count, 1u, digits);
    if (live) store(o - out_base, t);
}

#ifdef FETCH4
// The input element of reduced element k (rc at k; with one reduced axis k itself: SwiftShader
// keeps the rc array in memory, so the common case of one merged axis avoids it).  A k
// past count reads element `step` before the axis' end (in range: the values are dropped).
uint vec4_offset(uint base, uint k, uint step) {
    if (RDIMS == 1) return base + min(k, count - step) * AT(rstride, 0);
    uint off = base;
    [[unroll]] for (int d = 0; d < RDIMS; d++) off += rc[d] * AT(rstride, d);
    return off;
}

// VEC4 1: the 4 * KEPT states of outputs c .. c + 4 * KEPT - 1, each element k read as
// KEPT consecutive texels
void walk_kept(uint base, uint o) {
    const int N = 4 * KEPT;
    State total[N], part[N];
    [[unroll]] for (int i = 0; i < N; i++) { total[i] = initial(); part[i] = initial(); }
    if (SPAN > 0) {
        // one reduced axis of SPAN elements, straight-line (no loop, no test per element)
        [[unroll]] for (int k = 0; k < SPAN; k++) {
            uint q = (base + uint(k) * AT(rstride, 0)) >> 2;
            [[unroll]] for (int h = 0; h < KEPT; h++) {
                vec4 v = FETCH4(q + uint(h));
                [[unroll]] for (int c = 0; c < 4; c++)
                    part[4 * h + c] = take(part[4 * h + c], v[c], uint(k));
            }
        }
        [[unroll]] for (int i = 0; i < N; i++)
            store(o + uint(i) * AT(out_stride, LAST), part[i]);
        return;
    }
    uint digits[8];
    [[unroll]] for (int d = 0; d < 8; d++) digits[d] = d == RDIMS - 1 ? 1u : 0u;
    uint j = 0u;
    for (uint k = 0u; k < count; k += UNROLL) {
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            uint q = vec4_offset(base, k + u, 1u) >> 2;
            vec4 v[KEPT];
            [[unroll]] for (int h = 0; h < KEPT; h++) v[h] = FETCH4(q + uint(h));
            if (k + u < count) {
                [[unroll]] for (int i = 0; i < N; i++)
                    part[i] = take(part[i], v[i >> 2][i & 3], k + u);
            }
            if (RDIMS > 1) advance(digits);
        }
        j += UNROLL;
        if (j >= BLOCK) {
            [[unroll]] for (int i = 0; i < N; i++) {
                total[i] = merge(total[i], part[i]);
                part[i] = initial();
            }
            j = 0u;
        }
    }
    [[unroll]] for (int i = 0; i < N; i++)
        store(o + uint(i) * AT(out_stride, LAST), merge(total[i], part[i]));
}

// VEC4 2: one output, its innermost reduced axis 4 elements a texel (rc[RDIMS - 1] stays
// a multiple of 4: that axis' size is a multiple of 4)
State walk_row(uint base) {
    State total = initial();
    State part = initial();
    if (SPAN > 0) {
        // one reduced axis of SPAN texels, straight-line (no loop, no test per texel)
        [[unroll]] for (int i = 0; i < SPAN; i++) {
            vec4 v = FETCH4((base >> 2) + uint(i));
            [[unroll]] for (uint c = 0u; c < 4u; c++) part = take(part, v[c], 4u * uint(i) + c);
        }
        return part;
    }
    uint digits[8];
    [[unroll]] for (int d = 0; d < 8; d++) digits[d] = d == RDIMS - 1 ? 4u : 0u;
    uint j = 0u;
    for (uint k = 0u; k < count; k += 4u * UNROLL) {
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            uint kk = k + 4u * u;
            vec4 v = FETCH4(vec4_offset(base, kk, 4u) >> 2);
            if (kk < count) {
                [[unroll]] for (uint i = 0u; i < 4u; i++) part = take(part, v[i], kk + i);
            }
            if (RDIMS > 1) advance(digits);
        }
        j += 4u * UNROLL;
        if (j >= BLOCK) {
            total = merge(total, part);
            part = initial();
            j = 0u;
        }
    }
    return merge(total, part);
}

// The components of texel q inside the run base .. base + count - 1 into t.
State take_edge(State t, uint base, uint q) {
    vec4 v = FETCH4(q);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint k = 4u * q + i - base;             // wraps below base: past count too
        if (k < count) t = take(t, v[i], k);
    }
    return t;
}

// VEC4 3: one output, elements base .. base + count - 1 (k = element - base): the first
// and last texels component by component, the texels between whole (no per-element test:
// the CPU drivers run each test under lane masks, which cost more than the reads)
State walk_span(uint base) {
    uint first = base >> 2, last = (base + count - 1u) >> 2;
    State total = initial();
    State part = take_edge(initial(), base, first);
    if (SPAN > 0) {
        // straight-line code: SwiftShader runs a loop's every iteration under lane masks
        // and keeps its variables in memory
        [[unroll]] for (int i = 1; i <= SPAN; i++) {
            uint q = first + uint(i);
            vec4 v = FETCH4(q);
            uint k = 4u * q - base;
            [[unroll]] for (uint c = 0u; c < 4u; c++) part = take(part, v[c], k + c);
        }
        return merge(total, take_edge(part, base, last));
    }
    uint j = 4u;
    for (uint q = first + 1u; q < last; q++) {
        vec4 v = FETCH4(q);
        uint k = 4u * q - base;
        [[unroll]] for (uint i = 0u; i < 4u; i++) part = take(part, v[i], k + i);
        j += 4u;
        if (j >= BLOCK) {
            total = merge(total, part);
            part = initial();
            j = 0u;
        }
    }
    if (last > first) part = take_edge(part, base, last);
    return merge(total, part);
}

void main_vec4() {
    if (gl_GlobalInvocationID.x >= x_count) return;
    uint u = origin[0].x + gl_GlobalInvocationID.x;   // the unit, row-major
    uint base = 0u, o = 0u;
    [[unroll]] for (int i = 0; i < KDIMS; i++) {
        int d = LAST - i;
        uint c = u;
        if (i < KDIMS - 1) {
            uint n = AT(out_size, d);
            if (VEC4 == 1 && d == LAST) n /= uint(4 * KEPT);
            c = u % n;
            u /= n;
        }
        if (VEC4 == 1 && d == LAST) c *= uint(4 * KEPT);
        base += c * AT(in_stride, d);
        o += c * AT(out_stride, d);
    }
    [[unroll]] for (int d = 0; d < 8; d++) rc[d] = 0u;
    if (VEC4 == 1) walk_kept(base, o);
    else store(o, VEC4 == 2 ? walk_row(base) : walk_span(base));
}
#endif

void main() {
#ifdef FETCH4
    if (VEC4 != 0) { main_vec4(); return; }
#endif
    if (GROUP) main_group(); else main_lane();
}
