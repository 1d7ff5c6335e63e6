#version 450
// DML_FOLD_OPERATOR_DESC (col2im) as a gather: each invocation owns one output element
// (n, c, o[0..D-1]) and adds, in a fixed order (window positions k in row-major order),
// every input element whose window position lands on it:
//     block b[d] = (o[d] + StartPadding[d] - k[d] * Dilations[d]) / Strides[d]
// when that division is exact and 0 <= b[d] < BlocksPerDimension[d].  No atomics, so the
// result is bit-identical on every run.  Arithmetic: float32 for float32/float16,
// float64 for float64, 32-bit integers wrapping modulo 2^bits for 8/16/32-bit integers
// (signed and unsigned add the same bits), 32-bit pairs with carry for 64-bit integers.
//
// vkml:variant fold_f32 F32=1
// vkml:variant fold_f32_texel F32=1 TEXEL=1
// vkml:variant fold_f16 F16=1
// vkml:variant fold_f16_packed F16_PACKED=1
// vkml:variant fold_f64 F64=1
// vkml:variant fold_i8 I8=1
// vkml:variant fold_i8_packed I8_PACKED=1
// vkml:variant fold_i16 I16=1
// vkml:variant fold_i16_packed I16_PACKED=1
// vkml:variant fold_i32 I32=1
// vkml:variant fold_i32_texel I32=1 TEXEL=1
// vkml:variant fold_f32_texel4 F32=1 TEXEL4=1
// vkml:variant fold_i32_texel4 I32=1 TEXEL4=1
// vkml:variant fold_i64 I64=1
// vkml:variant fold_f32_ssbo4 F32=1 TEXEL4=1 SSBO4=1
// vkml:variant fold_i32_ssbo4 I32=1 TEXEL4=1 SSBO4=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_index.glsl"
#define VKML_WINDOW_DIMS 6
#include "vkml_window.glsl"

#if defined(F32) || defined(F16) || defined(F16_PACKED)
#include "vkml_float.glsl"
#define ACC float
#define ZERO 0.0
#define ADD(a, b) ((a) + (b))
#if defined(SSBO4)
// the TEXEL4 reads from a vec4 storage buffer (SwiftShader: one 16-byte load a lane)
layout(std430, set = 0, binding = 0) readonly buffer In4 { vec4 x4[]; };
#define FETCH4(i) x4[i]
#elif defined(TEXEL) || defined(TEXEL4)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define LOAD(i) texelFetch(Xt, int(i)).x
#define FETCH4(i) texelFetch(Xt, i)
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
#define LOAD(i) FLOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };
#define STORE(i, v) FSTORE(y, i, v)
#ifdef F32
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#define VEC4 vec4
#endif

#elif defined(F64)
#define ACC double
#define ZERO 0.0LF
#define ADD(a, b) ((a) + (b))
layout(std430, set = 0, binding = 0) readonly buffer In { double x[]; };
layout(std430, set = 0, binding = 1) buffer Out { double y[]; };
#define LOAD(i) x[i]
#define STORE(i, v) y[i] = (v)

#elif defined(I64)
#define ACC uvec2
#define ZERO uvec2(0u)
uvec2 add64(uvec2 a, uvec2 b) {
    uint carry;
    uint lo = uaddCarry(a.x, b.x, carry);
    return uvec2(lo, a.y + b.y + carry);
}
#define ADD(a, b) add64(a, b)
layout(std430, set = 0, binding = 0) readonly buffer In { uvec2 x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uvec2 y[]; };
#define LOAD(i) x[i]
#define STORE(i, v) y[i] = (v)

#else   // 8, 16, 32-bit integers: 32-bit sums, the low bits stored
#define ACC uint
#define ZERO 0u
#define ADD(a, b) ((a) + (b))
#if defined(I8)
#extension GL_EXT_shader_8bit_storage : require
layout(std430, set = 0, binding = 0) readonly buffer In { uint8_t x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint8_t y[]; };
#define LOAD(i) uint(x[i])
#define STORE(i, v) y[i] = uint8_t(v)
#elif defined(I16)
#extension GL_EXT_shader_16bit_storage : require
layout(std430, set = 0, binding = 0) readonly buffer In { uint16_t x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint16_t y[]; };
#define LOAD(i) uint(x[i])
#define STORE(i, v) y[i] = uint16_t(v)
#elif defined(I8_PACKED)
layout(std430, set = 0, binding = 0) readonly buffer In { uint x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
#define LOAD(i) VKML_LD8(x, i)
#define STORE(i, v) VKML_ST8(y, i, v)
#elif defined(I16_PACKED)
layout(std430, set = 0, binding = 0) readonly buffer In { uint x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
#define LOAD(i) VKML_LD16(x, i)
#define STORE(i, v) VKML_ST16(y, i, v)
#else   // I32
#if defined(SSBO4)
layout(std430, set = 0, binding = 0) readonly buffer In4 { uvec4 x4[]; };
#define FETCH4(i) x4[i]
#elif defined(TEXEL) || defined(TEXEL4)
layout(set = 0, binding = 0) uniform usamplerBuffer Xt;
#define LOAD(i) texelFetch(Xt, int(i)).x
#define FETCH4(i) texelFetch(Xt, i)
#else
layout(std430, set = 0, binding = 0) readonly buffer In { uint x[]; };
#define LOAD(i) x[i]
#endif
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { uvec4 y4[]; };
#define VEC4 uvec4
#define STORE(i, v) y[i] = (v)
#endif
#endif

// Workgroups span LY rows of the y dimension: lavapipe's cost per workgroup is high, and a
// row of the last dimension is often shorter than a good workgroup.
layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // output dimensions: N, C, D spatial
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
// Consecutive outputs along the last dimension per invocation (1, 4 or 8; XDIMS = 1
// only): their window reads are neighbours, and lavapipe stores a vec4 far faster than
// 4 floats.
layout(constant_id = 21) const uint V = 1u;
layout(constant_id = 22) const bool VEC_STORE = false;   // V = 4 or 8 stored as vec4s

// Parameters in a uniform buffer (std140); none of them steers control flow.
layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride;              // .x N, .y row (C x window), .z column (block)
    ivec4 start[2];               // StartPadding per spatial dimension
    uvec4 blocks[2];              // BlocksPerDimension
    uvec4 block_stride[2];        // column index step of each spatial block coordinate
    uint in_texels;               // TEXEL4: 4-element texels bound
};

#define VKML_BOX_COORD
#include "vkml_box.glsl"

// Block coordinate of output coordinate o for window position k along dimension d,
// and whether it exists: (o + start - k * dilation) / stride, exact, in [0, blocks).
uint block_of(int d, uint o, uint k, out bool ok) {
    int t = int(o) + AT(start, d) - int(k * dil(d));
    ok = t >= 0;
    uint b = uint(t);
    if (stride(d) != 1u) {
        ok = ok && (b % stride(d)) == 0u;
        b /= stride(d);
    }
    ok = ok && b < AT(blocks, d);
    return b;
}

#ifdef TEXEL4
VKML_SHIFT4(VEC4)
#endif

const int D = RANK - 2;
const int LAST = RANK - 1;
const uint WL = D == 1 ? W0 : D == 2 ? W1 : D == 3 ? W2 : D == 4 ? W3 : D == 5 ? W4 : W5;
const uint KO = (W0 * W1 * W2 * W3 * W4 * W5) / WL;
ACC acc[8];
#ifdef TEXEL4
VEC4 acc4[2];
#endif

// Window position (ko, kl) of the V outputs: add its inputs (window row `row`).
void add_position(uint row, uint kl) {
#ifdef TEXEL4
    // Unit last stride and packed columns: the V elements are neighbours in the
    // input, read as V/4 + 1 aligned 4-element texels and shifted into place.
    int t0 = int(coord[LAST]) + AT(start, D - 1) - int(kl * dil(D - 1));
    int e0 = int(row + kl * in_stride.y) + t0;
    int q = e0 >> 2;
    uint sh = uint(e0) & 3u;
    #ifdef SSBO4
    int last = int(x4.length()) - 1;       // this binding's (a window's) vec4s
#else
    int last = int(in_texels) - 1;
#endif
    VEC4 w0 = FETCH4(clamp(q, 0, last));
    VEC4 w1 = FETCH4(clamp(q + 1, 0, last));
    VEC4 r0 = shift4(w0, w1, sh);
    uvec4 b0 = uvec4(ivec4(t0) + ivec4(0, 1, 2, 3));
    acc4[0] += mix(VEC4(ZERO), r0, lessThan(b0, uvec4(AT(blocks, D - 1))));
    if (V == 8u) {
        VEC4 w2 = FETCH4(clamp(q + 2, 0, last));
        VEC4 r1 = shift4(w1, w2, sh);
        acc4[1] += mix(VEC4(ZERO), r1, lessThan(b0 + 4u, uvec4(AT(blocks, D - 1))));
    }
#else
    [[unroll]] for (uint j = 0u; j < V; j++) {
        bool okl;
        uint b = block_of(D - 1, coord[LAST] + j, kl, okl);
        ACC v = LOAD(okl ? row + kl * in_stride.y + b * in_stride.z : 0u);
        acc[j] = ADD(acc[j], okl ? v : ZERO);
    }
#endif
}

void main() {
    if (box_outside()) return;
    box_coord();
    // Elements of this invocation inside the box (V > 1: the last may overhang it).
    uint count = min(V, AT(origin, LAST) + AT(extent, LAST) - coord[LAST]);
    uint out_off = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) out_off += coord[d] * AT(out_stride, d);
    uint base = coord[0] * in_stride.x + coord[1] * (W0 * W1 * W2 * W3 * W4 * W5) * in_stride.y
                - in_base;

    // Window positions in row-major order: the outer spatial dimensions (all but the
    // last) as `ko`, the last as `kl`; the outer check is the same for all V elements.
    [[unroll]] for (uint j = 0u; j < 8u; j++) acc[j] = ZERO;
#ifdef TEXEL4
    acc4[0] = VEC4(ZERO);
    acc4[1] = VEC4(ZERO);
#endif
    for (uint ko = 0u; ko < KO; ko++) {
        uint rem = ko;
        uint col = 0u;
        bool ok = true;
        [[unroll]] for (int d = D - 2; d >= 0; d--) {
            uint k = rem % win(d);
            rem /= win(d);
            bool okd;
            col += block_of(d, coord[2 + d], k, okd) * AT(block_stride, d);
            ok = ok && okd;
        }
        if (!ok) continue;
        uint row = base + ko * WL * in_stride.y + col * in_stride.z;
        if (WL <= 32u) {              // unrolled (bounded: a large window compiles slowly)
            [[unroll]] for (uint kl = 0u; kl < WL; kl++) add_position(row, kl);
        } else {
            for (uint kl = 0u; kl < WL; kl++) add_position(row, kl);
        }
    }
#ifdef TEXEL4
    acc[0] = acc4[0].x; acc[1] = acc4[0].y; acc[2] = acc4[0].z; acc[3] = acc4[0].w;
    acc[4] = acc4[1].x; acc[5] = acc4[1].y; acc[6] = acc4[1].z; acc[7] = acc4[1].w;
#endif
    uint o = out_off - out_base;
#if defined(F32) || defined(I32)
    if (VEC_STORE && count == V) {    // V = 4 or 8, o a multiple of 4
        y4[o >> 2] = VEC4(acc[0], acc[1], acc[2], acc[3]);
        if (V == 8u) y4[(o >> 2) + 1u] = VEC4(acc[4], acc[5], acc[6], acc[7]);
        return;
    }
#endif
    uint ostep = AT(out_stride, LAST);
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) STORE(o + j * ostep, acc[j]);
    }
}
