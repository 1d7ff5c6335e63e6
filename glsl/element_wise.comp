#version 450
// The element-wise family: DML_ELEMENT_WISE_{ADD, ADD1, SUBTRACT, MULTIPLY, DIVIDE, MAX,
// MIN, IDENTITY}_OPERATOR_DESC.  Y[i] = OP(A[i], B[i]) (IDENTITY: Y[i] = A[i]), then, for
// float types, the activation ACT (ADD1's fused one; IDENTITY's ScaleBias as LINEAR).
// OP, the data type DTYPE (DML_TENSOR_DATA_TYPE's value) and ACT are specialization
// constants, so each pipeline keeps only its own arithmetic; lavapipe rebuilds a shader
// whose branches hang on uniform values (docs/DEVELOPING.md).
//
// Every tensor is bound as 32-bit words, whatever its type, so one text serves all 11
// types on every device: 8/16-bit elements are extracted from their word (stores change
// only their bits, with atomics), 64-bit ones are word pairs with the integer arithmetic
// written on them (SwiftShader has no shaderInt64; add/sub/mul/min/max are a few word
// operations, division a 64-step shift-subtract loop).  float16 is computed in float32
// and rounded once to nearest even (exact for + - * / of halves).
//
// element_wise: any strides (0 broadcasts); an invocation takes V neighbours along the
//   last dimension.  Grid as glsl/activation.comp: x along the last XDIMS dimensions,
//   y the one before, z the rest.
// element_wise_texel4 / _ssbo4 (FLAT): A, B and Y packed with one layout; the host
//   flattens them to one dimension of words, V (a multiple of 4) words an invocation,
//   read four at a time (an RGBA32UI texel, which lavapipe vectorizes, or a uvec4
//   storage-buffer load) and stored as uvec4s.  A word holds whole elements, so the
//   arithmetic runs on the elements inside each word.
// element_wise_row_texel4 / _ssbo4 (ROW): the box the host merged to (outer, rows, inner
//   extent in words: three dimensions, the host pads it or runs the dimensions before
//   those in dispatches of their own), each operand either contiguous along the inner
//   extent (strides in words) or constant along it (A_BCAST / B_BCAST: strides in
//   elements, the one element of the row loaded once an invocation and replicated across
//   a uvec4), the output
//   contiguous: a per-channel bias or scale over NCHW runs as the flat path does, V words
//   an invocation along a row, as uvec4s where every row starts on a whole uvec4 (VEC4),
//   else word by word.  Grid: x along the row, y the rows, z the outer dimension.
// element_wise_f32_*: float32 with no activation, the FLAT or ROW main with the float16
//   conversions and the activations left out of its element code (SwiftShader runs the
//   float variants' element code, where those are dead, several times slower).
// *_u64 (f32 and copy, FLAT and ROW; devices with int64 shaders, where the device's own
//   timing found them faster: vkml/ops/store_width.py): the full invocations' uvec4 pairs
//   stored as one u64vec4 (lavapipe stores a vector one scalar per component).
// element_wise_copy_*: IDENTITY without ScaleBias (any type: its bits), the FLAT or ROW
//   main with no element code in its uvec4 loop: on SwiftShader the mere presence of that
//   code there (dead for an identity: OP and ACT fold it away) made a copy several times slower.
// No early return: on lavapipe, uniform loads after a divergent return become per-lane
// gathers (docs/DEVELOPING.md).
//
// Three classes of type, each its own variant so that a pipeline holds only its class's
// arithmetic (SwiftShader compiles the branches a specialization constant rules out, and
// the 64-bit division loop and the activations cost it seconds a pipeline): FLOATV
// (float32, float16: the operations in float32, then ACT), INTV (8/16/32-bit integers),
// INT64V (64-bit integers; float64, moved only).
//
// vkml:variant element_wise_float FLOATV=1
// vkml:variant element_wise_int INTV=1
// vkml:variant element_wise_int64 INT64V=1
// vkml:variant element_wise_float_texel4 FLOATV=1 FLAT=1 TEXEL4=1
// vkml:variant element_wise_int_texel4 INTV=1 FLAT=1 TEXEL4=1
// vkml:variant element_wise_int64_texel4 INT64V=1 FLAT=1 TEXEL4=1
// vkml:variant element_wise_float_ssbo4 FLOATV=1 FLAT=1 SSBO4=1
// vkml:variant element_wise_int_ssbo4 INTV=1 FLAT=1 SSBO4=1
// vkml:variant element_wise_int64_ssbo4 INT64V=1 FLAT=1 SSBO4=1
// vkml:variant element_wise_f32_texel4 FLOATV=1 F32PLAIN=1 FLAT=1 TEXEL4=1
// vkml:variant element_wise_f32_ssbo4 FLOATV=1 F32PLAIN=1 FLAT=1 SSBO4=1
// vkml:variant element_wise_f32_row_texel4 FLOATV=1 F32PLAIN=1 FLAT=1 ROW=1 TEXEL4=1
// vkml:variant element_wise_f32_row_ssbo4 FLOATV=1 F32PLAIN=1 FLAT=1 ROW=1 SSBO4=1
// vkml:variant element_wise_copy_texel4 INTV=1 COPY=1 FLAT=1 TEXEL4=1
// vkml:variant element_wise_copy_ssbo4 INTV=1 COPY=1 FLAT=1 SSBO4=1
// vkml:variant element_wise_copy_row_texel4 INTV=1 COPY=1 FLAT=1 ROW=1 TEXEL4=1
// vkml:variant element_wise_copy_row_ssbo4 INTV=1 COPY=1 FLAT=1 ROW=1 SSBO4=1
// vkml:variant element_wise_float_row_texel4 FLOATV=1 FLAT=1 ROW=1 TEXEL4=1
// vkml:variant element_wise_int_row_texel4 INTV=1 FLAT=1 ROW=1 TEXEL4=1
// vkml:variant element_wise_int64_row_texel4 INT64V=1 FLAT=1 ROW=1 TEXEL4=1
// vkml:variant element_wise_float_row_ssbo4 FLOATV=1 FLAT=1 ROW=1 SSBO4=1
// vkml:variant element_wise_int_row_ssbo4 INTV=1 FLAT=1 ROW=1 SSBO4=1
// vkml:variant element_wise_int64_row_ssbo4 INT64V=1 FLAT=1 ROW=1 SSBO4=1
// vkml:variant element_wise_f32_texel4_u64 FLOATV=1 F32PLAIN=1 FLAT=1 TEXEL4=1 U64=1
// vkml:variant element_wise_f32_ssbo4_u64 FLOATV=1 F32PLAIN=1 FLAT=1 SSBO4=1 U64=1
// vkml:variant element_wise_f32_row_texel4_u64 FLOATV=1 F32PLAIN=1 FLAT=1 ROW=1 TEXEL4=1 U64=1
// vkml:variant element_wise_f32_row_ssbo4_u64 FLOATV=1 F32PLAIN=1 FLAT=1 ROW=1 SSBO4=1 U64=1
// vkml:variant element_wise_copy_texel4_u64 INTV=1 COPY=1 FLAT=1 TEXEL4=1 U64=1
// vkml:variant element_wise_copy_ssbo4_u64 INTV=1 COPY=1 FLAT=1 SSBO4=1 U64=1
// vkml:variant element_wise_copy_row_texel4_u64 INTV=1 COPY=1 FLAT=1 ROW=1 TEXEL4=1 U64=1
// vkml:variant element_wise_copy_row_ssbo4_u64 INTV=1 COPY=1 FLAT=1 ROW=1 SSBO4=1 U64=1
#extension GL_EXT_control_flow_attributes : enable
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
#include "vkml_index.glsl"
#ifdef FLOATV
#include "vkml_activation.glsl"
#else
const int ACT_NONE = 0;
#endif

#if defined(TEXEL4)
layout(set = 0, binding = 0) uniform usamplerBuffer At;
layout(set = 0, binding = 1) uniform usamplerBuffer Bt;
#define LOADA4(q) texelFetch(At, int(q))
#define LOADB4(q) texelFetch(Bt, int(q))
#define LOADA1(w) texelFetch(At, int((w) >> 2))[(w) & 3u]
#define LOADB1(w) texelFetch(Bt, int((w) >> 2))[(w) & 3u]
#elif defined(SSBO4)
layout(std430, set = 0, binding = 0) readonly buffer A4 { uvec4 a4[]; };
layout(std430, set = 0, binding = 1) readonly buffer B4 { uvec4 b4[]; };
#define LOADA4(q) a4[q]
#define LOADB4(q) b4[q]
#define LOADA1(w) a4[(w) >> 2][(w) & 3u]
#define LOADB1(w) b4[(w) >> 2][(w) & 3u]
#else
layout(std430, set = 0, binding = 0) readonly buffer A { uint a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { uint b[]; };
#endif
layout(std430, set = 0, binding = 2) buffer Out { uint y[]; };
#ifdef FLAT
layout(std430, set = 0, binding = 2) buffer Out4 { uvec4 y4[]; };
#endif
#ifdef U64
layout(std430, set = 0, binding = 2) buffer Out8 { u64vec4 y8[]; };
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 1 to 8 dimensions
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 21) const uint V = 1u;      // elements (FLAT: words) per invocation
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case; OP, DTYPE, A_BCAST, B_BCAST and VEC4
// pick the row path's operation and broadcast operand (SwiftShader runs both sides of a branch
// on an unfrozen constant).
// vkml:frozen ACT OP DTYPE A_BCAST B_BCAST VEC4
// DirectML runs these operators in place (the output bound to an input's memory): the
// host decorates the bindings Aliased, so that no driver reorders a binding's loads past
// another's stores (vkml.runtime.spirv.alias).
// vkml:aliased
layout(constant_id = 24) const int ACT = 0;      // ACT_* of vkml_activation.glsl (floats)
layout(constant_id = 25) const int OP = 0;       // OP_* below
layout(constant_id = 26) const int DTYPE = 1;    // DML_TENSOR_DATA_TYPE
#ifdef ROW
layout(constant_id = 27) const bool A_BCAST = false;   // A constant along the inner extent
layout(constant_id = 28) const bool B_BCAST = false;
layout(constant_id = 29) const bool VEC4 = false;      // rows on whole uvec4s
#endif

const int OP_IDENTITY = 0, OP_ADD = 1, OP_SUBTRACT = 2, OP_MULTIPLY = 3, OP_DIVIDE = 4,
          OP_MAX = 5, OP_MIN = 6;
const int T_F32 = 1, T_F16 = 2, T_U32 = 3, T_U16 = 4, T_U8 = 5, T_I32 = 6, T_I16 = 7,
          T_I8 = 8, T_F64 = 9, T_U64 = 10, T_I64 = 11;
const uint WIDTH = (DTYPE == T_U8 || DTYPE == T_I8) ? 1u
                 : (DTYPE == T_F16 || DTYPE == T_U16 || DTYPE == T_I16) ? 2u
                 : (DTYPE == T_F64 || DTYPE == T_U64 || DTYPE == T_I64) ? 8u : 4u;
const uint BITS = WIDTH >= 4u ? 32u : 8u * WIDTH;
const uint MASK = WIDTH >= 4u ? 0xFFFFFFFFu : (1u << BITS) - 1u;
const bool SIGNED = DTYPE == T_I8 || DTYPE == T_I16 || DTYPE == T_I32 || DTYPE == T_I64;
const bool FLOATS = DTYPE == T_F32 || DTYPE == T_F16;

layout(std140, set = 0, binding = 3) uniform Params {
    uvec4 out_stride[2];          // per dimension, in elements
    uvec4 a_stride[2];
    uvec4 b_stride[2];
    vec4 p;                       // the activation's parameters (kernel_parameters())
};

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint a_base, b_base, out_base;   // element (FLAT: word) index of each binding's start
    uint x_count;                 // invocations along x
    uvec4 magic[2];               // ceil(2^32 / extent): see divide()
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

#ifdef INT64V
// ---- 64-bit integers on word pairs (x: low word, y: high word) -------------------------
uvec2 add64(uvec2 u, uvec2 v) {
    uint c;
    uint lo = uaddCarry(u.x, v.x, c);
    return uvec2(lo, u.y + v.y + c);
}

uvec2 sub64(uvec2 u, uvec2 v) {
    uint c;
    uint lo = usubBorrow(u.x, v.x, c);
    return uvec2(lo, u.y - v.y - c);
}

uvec2 mul64(uvec2 u, uvec2 v) {           // the low 64 bits: the same signed or not
    uint hi, lo;
    umulExtended(u.x, v.x, hi, lo);
    return uvec2(lo, hi + u.x * v.y + u.y * v.x);
}

bool less64(uvec2 u, uvec2 v) {
    if (u.y != v.y) return SIGNED ? int(u.y) < int(v.y) : u.y < v.y;
    return u.x < v.x;
}

// floor(n / d) for unsigned n, d; 0 for d = 0 (vkml's definition, see element_wise.py).
uvec2 udiv64(uvec2 n, uvec2 d) {
    if (d.x == 0u && d.y == 0u) return uvec2(0u);
    if (n.y == 0u && d.y == 0u) return uvec2(n.x / d.x, 0u);
    uvec2 q = uvec2(0u), r = uvec2(0u);
    for (int i = 63; i >= 0; i--) {
        r = uvec2(r.x << 1, (r.y << 1) | (r.x >> 31));
        r.x |= (i >= 32 ? n.y >> (i - 32) : n.x >> i) & 1u;
        if (!(r.y < d.y || (r.y == d.y && r.x < d.x))) {
            r = sub64(r, d);
            if (i >= 32) q.y |= 1u << (i - 32); else q.x |= 1u << i;
        }
    }
    return q;
}

uvec2 op64(uvec2 u, uvec2 v) {
    if (OP == OP_ADD) return add64(u, v);
    if (OP == OP_SUBTRACT) return sub64(u, v);
    if (OP == OP_MULTIPLY) return mul64(u, v);
    if (OP == OP_MAX) return less64(u, v) ? v : u;
    if (OP == OP_MIN) return less64(v, u) ? v : u;
    if (OP == OP_DIVIDE) {        // truncated toward zero: magnitudes, then the sign
        if (!SIGNED) return udiv64(u, v);
        bool nu = int(u.y) < 0, nv = int(v.y) < 0;
        uvec2 q = udiv64(nu ? sub64(uvec2(0u), u) : u, nv ? sub64(uvec2(0u), v) : v);
        return nu != nv ? sub64(uvec2(0u), q) : q;
    }
    return u;
}

#endif

#ifdef INTV
// ---- 8/16/32-bit integers in 32-bit arithmetic (wrapped to the type on store) ----------
uint op32(uint u, uint v) {
    int s = bitfieldExtract(int(u), 0, int(BITS)), t = bitfieldExtract(int(v), 0, int(BITS));
    if (OP == OP_ADD) return u + v;
    if (OP == OP_SUBTRACT) return u - v;
    if (OP == OP_MULTIPLY) return u * v;
    if (OP == OP_MAX) return SIGNED ? uint(max(s, t)) : max(u, v);
    if (OP == OP_MIN) return SIGNED ? uint(min(s, t)) : min(u, v);
    if (OP == OP_DIVIDE) {        // truncated toward zero, x / 0 = 0
        if (v == 0u) return 0u;
        if (!SIGNED) return u / v;
        uint q = uint(abs(s)) / uint(abs(t));   // abs(INT_MIN) wraps to 2^31 as a uint
        return (s < 0) != (t < 0) ? 0u - q : q;
    }
    return u;
}

#endif

#ifdef FLOATV
float load_float(uint bits) {
    return DTYPE == T_F16 ? vkml_half_float(bits) : uintBitsToFloat(bits);
}

uint store_float(float f) {
    return DTYPE == T_F16 ? vkml_half_bits(f) : floatBitsToUint(f);
}

float opf(float u, float v) {
    if (OP == OP_ADD) return u + v;
    if (OP == OP_SUBTRACT) return u - v;
    if (OP == OP_MULTIPLY) return u * v;
    if (OP == OP_DIVIDE) return u / v;
    if (OP == OP_MAX) return max(u, v);
    if (OP == OP_MIN) return min(u, v);
    return u;
}

#endif

// One element: raw bits in (x, y: the high word of 64-bit types), result raw bits.
uvec2 element(uvec2 u, uvec2 v) {
    if (OP == OP_IDENTITY && ACT == ACT_NONE) return u;
#if defined(F32PLAIN)
    return uvec2(floatBitsToUint(opf(uintBitsToFloat(u.x), uintBitsToFloat(v.x))), 0u);
#elif defined(FLOATV)
    float r = opf(load_float(u.x), load_float(v.x));
    if (ACT != ACT_NONE) r = vkml_activation(ACT, r, p);
    return uvec2(store_float(r), 0u);
#elif defined(INT64V)
    return DTYPE == T_F64 ? u : op64(u, v);
#else
    return uvec2(op32(u.x, v.x), 0u);
#endif
}

// A word of packed elements (WIDTH <= 4).
uint word(uint u, uint v) {
    if (WIDTH == 4u) return element(uvec2(u, 0u), uvec2(v, 0u)).x;
#ifdef INTV
    // 8/16-bit ADD and SUBTRACT on the whole word at once (Hacker's Delight 2-18): the top
    // bit of each element apart, so no carry or borrow crosses into the next element;
    // wrapping arithmetic, the same for signed and unsigned types
    const uint H = WIDTH == 1u ? 0x80808080u : 0x80008000u;
    if (OP == OP_ADD) return ((u & ~H) + (v & ~H)) ^ ((u ^ v) & H);
    if (OP == OP_SUBTRACT) return ((u | H) - (v & ~H)) ^ ((u ^ ~v) & H);
#endif
    uint r = 0u;
    [[unroll]] for (uint k = 0u; k < 4u / WIDTH; k++) {
        uint s = k * BITS;
        r |= (element(uvec2((u >> s) & MASK, 0u), uvec2((v >> s) & MASK, 0u)).x & MASK) << s;
    }
    return r;
}

#ifdef F32PLAIN
vec4 opf4(vec4 u, vec4 v) {
    if (OP == OP_ADD) return u + v;
    if (OP == OP_SUBTRACT) return u - v;
    if (OP == OP_MULTIPLY) return u * v;
    if (OP == OP_DIVIDE) return u / v;
    if (OP == OP_MAX) return max(u, v);
    if (OP == OP_MIN) return min(u, v);
    return u;
}
#endif

uvec4 words(uvec4 u, uvec4 v) {
#ifdef F32PLAIN
    // four float32 elements as one vec4 (no per-word element code)
    return floatBitsToUint(opf4(uintBitsToFloat(u), uintBitsToFloat(v)));
#endif
    if (WIDTH == 8u) {
        return uvec4(element(u.xy, v.xy), element(u.zw, v.zw));
    }
    return uvec4(word(u.x, v.x), word(u.y, v.y), word(u.z, v.z), word(u.w, v.w));
}

// Four words of the uvec4 loops (COPY: A's).
#ifdef COPY
#define WORDS4(u, v) (u)
#else
#define WORDS4(u, v) words(u, v)
#endif

// a / extent[d] for a < 2^16 (the host keeps grid coordinates below it): the high word of
// a * ceil(2^32 / extent), exact there.
uint divide(uint q, int d) {
    uint hi, lo;
    umulExtended(q, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? q : hi;
}

const int LAST = RANK - 1;

// The box coordinates of this invocation's first element (V of the last dimension an
// invocation along x) and how many of its V it has (0: none).
uint box_coords(out uint coord[8]) {
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
        if (d == YDIM + 1) {          // the outermost x dimension: gx < its extent
            coord[d] = AT(origin, d) + gx * V;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
    uint end = AT(origin, LAST) + AT(extent, LAST);
    return live && coord[LAST] < end ? min(V, end - coord[LAST]) : 0u;
}

#ifndef FLAT
uvec2 load_elem_a(uint i) {
    if (WIDTH == 1u) return uvec2(VKML_LD8(a, i), 0u);
    if (WIDTH == 2u) return uvec2(VKML_LD16(a, i), 0u);
    if (WIDTH == 8u) return uvec2(a[2u * i], a[2u * i + 1u]);
    return uvec2(a[i], 0u);
}

uvec2 load_elem_b(uint i) {
    if (WIDTH == 1u) return uvec2(VKML_LD8(b, i), 0u);
    if (WIDTH == 2u) return uvec2(VKML_LD16(b, i), 0u);
    if (WIDTH == 8u) return uvec2(b[2u * i], b[2u * i + 1u]);
    return uvec2(b[i], 0u);
}

void store_elem(uint i, uvec2 r) {
    if (WIDTH == 1u) {
        VKML_ST8(y, i, r.x);
    } else if (WIDTH == 2u) {
        VKML_ST16(y, i, r.x);
    } else if (WIDTH == 8u) {
        y[2u * i] = r.x;
        y[2u * i + 1u] = r.y;
    } else {
        y[i] = r.x;
    }
}

void main() {
    uint coord[8];
    uint count = box_coords(coord);
    uint sa = 0u, sb = 0u, so = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        sa += coord[d] * AT(a_stride, d);
        sb += coord[d] * AT(b_stride, d);
        so += coord[d] * AT(out_stride, d);
    }
    sa -= a_base;
    sb -= b_base;
    so -= out_base;
    uint ta = AT(a_stride, LAST), tb = AT(b_stride, LAST), to = AT(out_stride, LAST);
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) {
            uvec2 u = load_elem_a(sa + j * ta);
            uvec2 v = OP == OP_IDENTITY ? u : load_elem_b(sb + j * tb);
            store_elem(so + j * to, element(u, v));
        }
    }
}
#elif defined(ROW)
// Element i (an element index) of a word buffer, raw bits (y: a 64-bit one's high word).
#define ELEM(LOAD1, i) (WIDTH == 8u ? uvec2(LOAD1(2u * (i)), LOAD1(2u * (i) + 1u)) \
    : uvec2(LOAD1((i) / (4u / WIDTH)) >> (((i) % (4u / WIDTH)) * BITS), 0u))

// One element's bits replicated over a uvec4 of words (every element of the four words).
uvec4 splat(uvec2 e) {
    if (WIDTH == 8u) return uvec4(e, e);
    uint w = WIDTH == 4u ? e.x : WIDTH == 2u ? (e.x & 0xFFFFu) * 0x10001u
                                             : (e.x & 0xFFu) * 0x01010101u;
    return uvec4(w);
}

// Words k.. of a row: the operand's own (contiguous) or its splatted constant.  An `if`
// on the (frozen) constant, not a ?: whose load SwiftShader would run anyway.
#define ROW4(BCAST, c, LOAD4, q, r) { r = c; if (!BCAST) r = LOAD4(q); }

void main() {
    // the box is three dimensions (the host pads it, and runs any further outer ones as
    // dispatches of their own through the bases): z, y and x of the grid, x in words, V
    // an invocation.  No coordinate array or loop over RANK: SwiftShader keeps such an
    // array in memory and runs such a loop rolled, in every invocation.
    uint gx = gl_GlobalInvocationID.x;
    uvec3 c = uvec3(origin[0].x + gl_GlobalInvocationID.z, origin[0].y + gl_GlobalInvocationID.y,
                    origin[0].z + gx * V);
    uint end = origin[0].z + extent[0].z;
    bool live = gx < x_count && gl_GlobalInvocationID.y < extent[0].y;
    uint count = live && c.z < end ? min(V, end - c.z) : 0u;     // words of the row
    uint sa = c.x * a_stride[0].x + c.y * a_stride[0].y + c.z * a_stride[0].z - a_base;
    uint sb = c.x * b_stride[0].x + c.y * b_stride[0].y + c.z * b_stride[0].z - b_base;
    uint so = c.x * out_stride[0].x + c.y * out_stride[0].y + c.z - out_base;
    // the row's broadcast values, loaded once (inside the box only: sa, sb lie in it)
    uvec4 ca = uvec4(0u), cb = uvec4(0u);
    if (A_BCAST && count > 0u) ca = splat(ELEM(LOADA1, sa));
    if (B_BCAST && OP != OP_IDENTITY && count > 0u) cb = splat(ELEM(LOADB1, sb));
    if (VEC4 && count == V) {                       // sa, sb, so multiples of 4 words
#ifdef U64
        // so a multiple of 8 words (the host's rule): pairs of uvec4s as one u64vec4
        [[unroll]] for (uint k = 0u; k < V / 4u; k += 2u) {
            uvec4 u0, v0, u1, v1;
            ROW4(A_BCAST, ca, LOADA4, (sa >> 2) + k, u0);
            ROW4(A_BCAST, ca, LOADA4, (sa >> 2) + k + 1u, u1);
            if (OP == OP_IDENTITY) { v0 = u0; v1 = u1; } else {
                ROW4(B_BCAST, cb, LOADB4, (sb >> 2) + k, v0);
                ROW4(B_BCAST, cb, LOADB4, (sb >> 2) + k + 1u, v1);
            }
            y8[(so >> 3) + k / 2u] = vkml_u64x4(WORDS4(u0, v0), WORDS4(u1, v1));
        }
#else
        [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
            uvec4 u, v;
            ROW4(A_BCAST, ca, LOADA4, (sa >> 2) + k, u);
            if (OP == OP_IDENTITY) v = u; else ROW4(B_BCAST, cb, LOADB4, (sb >> 2) + k, v);
            y4[(so >> 2) + k] = WORDS4(u, v);
        }
#endif
    } else if (VEC4) {                              // a row's end: whole uvec4s
        // not unrolled: lavapipe would run an unrolled tail's masked loads and stores in
        // every SIMD group, whether or not a lane of it takes this branch
        [[dont_unroll]] for (uint j = 0u; j < count; j += 4u) {
            uvec4 u, v;
            ROW4(A_BCAST, ca, LOADA4, (sa + j) >> 2, u);
            if (OP == OP_IDENTITY) v = u; else ROW4(B_BCAST, cb, LOADB4, (sb + j) >> 2, v);
            y4[(so + j) >> 2] = WORDS4(u, v);
        }
    } else {                                        // rows on words only
        const uint STEP = WIDTH == 8u ? 2u : 1u;
        [[unroll]] for (uint j = 0u; j < V; j += STEP) {
            if (j < count) {
                if (WIDTH == 8u) {
                    uvec2 u = A_BCAST ? ca.xy : uvec2(LOADA1(sa + j), LOADA1(sa + j + 1u));
                    uvec2 v = OP == OP_IDENTITY ? u
                            : B_BCAST ? cb.xy : uvec2(LOADB1(sb + j), LOADB1(sb + j + 1u));
                    uvec2 r = element(u, v);
                    y[so + j] = r.x;
                    y[so + j + 1u] = r.y;
                } else {
                    uint u = A_BCAST ? ca.x : LOADA1(sa + j);
                    y[so + j] = word(u, OP == OP_IDENTITY ? u : B_BCAST ? cb.x : LOADB1(sb + j));
                }
            }
        }
    }
}
#else
void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint w0 = origin[0].x + gx * V;                 // words
    uint end = origin[0].x + extent[0].x;
    uint count = gx < x_count && w0 < end ? min(V, end - w0) : 0u;
    uint sa = w0 - a_base, sb = w0 - b_base, so = w0 - out_base;   // multiples of 4
    if (count == V) {
#ifdef U64
        // so a multiple of V, itself of 8 words: pairs of uvec4s as one u64vec4
        [[unroll]] for (uint k = 0u; k < V / 4u; k += 2u) {
            uvec4 u0 = LOADA4((sa >> 2) + k), u1 = LOADA4((sa >> 2) + k + 1u);
            uvec4 v0 = OP == OP_IDENTITY ? u0 : LOADB4((sb >> 2) + k);
            uvec4 v1 = OP == OP_IDENTITY ? u1 : LOADB4((sb >> 2) + k + 1u);
            y8[(so >> 3) + k / 2u] = vkml_u64x4(WORDS4(u0, v0), WORDS4(u1, v1));
        }
#else
        [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
            uvec4 u = LOADA4((sa >> 2) + k);
            uvec4 v = OP == OP_IDENTITY ? u : LOADB4((sb >> 2) + k);
            y4[(so >> 2) + k] = WORDS4(u, v);
        }
#endif
    } else {                                         // the tail: whole elements of words
        // not unrolled: the main loop's copy of the element code is enough to compile
        const uint STEP = WIDTH == 8u ? 2u : 1u;
        [[dont_unroll]] for (uint j = 0u; j < count; j += STEP) {
            {
                if (WIDTH == 8u) {
                    uvec2 u = uvec2(LOADA1(sa + j), LOADA1(sa + j + 1u));
                    uvec2 v = OP == OP_IDENTITY ? u : uvec2(LOADB1(sb + j), LOADB1(sb + j + 1u));
                    uvec2 r = element(u, v);
                    y[so + j] = r.x;
                    y[so + j + 1u] = r.y;
                } else {
                    uint u = LOADA1(sa + j);
                    y[so + j] = word(u, OP == OP_IDENTITY ? u : LOADB1(sb + j));
                }
            }
        }
    }
}
#endif
