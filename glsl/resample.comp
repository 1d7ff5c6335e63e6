#version 450
// DML_RESAMPLE1_OPERATOR_DESC (and RESAMPLE, UPSAMPLE_2D through it): output element o
// reads, per dimension d, input coordinate
//     x[d] = o[d] * a[d] + b[d],   a = 1 / Scale, b = -OutputPixelOffset / Scale - InputPixelOffset
// (the page's OutputX = (InputX + InputPixelOffset) * Scale + OutputPixelOffset solved for
// InputX; the host folds it to a and b, so no lane divides).  MODE 0 (nearest) takes index
// floor(x + 0.5), computed as floor(x) plus (frac >= 0.5) so no rounding of x + 0.5 can
// move a result; MODE 1 (linear) takes floor(x) and floor(x) + 1 weighted 1 - frac and
// frac, along the dimensions of LIN_MASK only (elsewhere the weight is 0: nearest's
// floor(x) = x).  Indices clamp to [0, size - 1] (the page's "output edges are clamped").
// Nearest moves each element's bits; linear computes in float32 (float16 and 8-bit values
// convert exactly), 8-bit results rounded to nearest even and saturated.
//
// vkml:variant resample_f32 F32=1
// vkml:variant resample_f32_texel F32=1 TEXEL=1
// vkml:variant resample_f32_u64 F32=1 U64=1
// vkml:variant resample_f32_texel_u64 F32=1 TEXEL=1 U64=1
// vkml:variant resample_f16 F16=1
// vkml:variant resample_f16_packed F16_PACKED=1
// vkml:variant resample_i8 I8=1
// vkml:variant resample_i8_packed I8=1 PACKED8=1
// vkml:variant resample_u8 U8=1
// vkml:variant resample_u8_packed U8=1 PACKED8=1
//
// The grid runs over the output box (grid.py: x along the last dimension only, V = 8
// outputs an invocation, a short row's tail masked; y and z the outer dimensions, so
// their index arithmetic is uniform per workgroup).
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_index.glsl"

#if defined(F32) || defined(F16) || defined(F16_PACKED)
#include "vkml_float.glsl"
#ifdef TEXEL
// lavapipe vectorizes texel fetches; storage-buffer loads go one lane at a time
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define LOAD(i) texelFetch(Xt, int(i)).x
#define LOADB(i) floatBitsToUint(texelFetch(Xt, int(i)).x)
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
#define LOAD(i) FLOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };
#define STORE(i, v) FSTORE(y, i, v)
// nearest moves bits (NaN payloads included): LOADB / STOREB
#if defined(F32)
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
// U64 (int64 devices where store_width's timing says so): the V outputs as one u64vec4
// where out_off is a multiple of 8 (lavapipe stores a vector's components one by one:
// 64-bit components carry twice the bytes for the same cost)
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
layout(std430, set = 0, binding = 1) buffer Out8 { u64vec4 y8[]; };
#define STORE8(o, a, b) if (((o) & 7u) == 0u) y8[(o) >> 3] = vkml_u64x4(a, b); else
#else
#define STORE8(o, a, b)
#endif
#ifndef TEXEL
#define LOADB(i) floatBitsToUint(x[i])
#endif
#define STOREB(i, v) y[i] = uintBitsToFloat(v)
#elif defined(F16)
#define LOADB(i) uint(x[i])
#define STOREB(i, v) y[i] = uint16_t(v)
#else
#define LOADB(i) VKML_LD16(x, i)
#define STOREB(i, v) VKML_ST16(y, i, v)
#endif

#else   // INT8 / UINT8: 8-bit storage, or bytes in 32-bit words (PACKED8)
#ifdef PACKED8
layout(std430, set = 0, binding = 0) readonly buffer In { uint x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
#define RAW(i) VKML_LD8(x, i)
#define PUT(i, v) VKML_ST8(y, i, v)
#else
#extension GL_EXT_shader_8bit_storage : require
layout(std430, set = 0, binding = 0) readonly buffer In { uint8_t x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint8_t y[]; };
#define RAW(i) uint(x[i])
#define PUT(i, v) y[i] = uint8_t(v);
#endif
#ifdef I8
#define LOAD(i) float(bitfieldExtract(int(RAW(i)), 0, 8))
const float LO8 = -128.0, HI8 = 127.0;
#else
#define LOAD(i) float(RAW(i))
const float LO8 = 0.0, HI8 = 255.0;
#endif
#define STORE(i, v) { uint b_ = uint(int(clamp(roundEven(v), LO8, HI8))) & 0xFFu; PUT(i, b_) }
#define LOADB(i) RAW(i)
#define STOREB(i, v) PUT(i, v)
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // dimensions of the box (1 to 5)
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
// Outputs of the last dimension an invocation: compile-time, so the V loops unroll and
// their arrays are registers (a loop bounded by a specialization constant with a body
// this large stays a loop on lavapipe and SwiftShader, its arrays in memory, per lane).
const uint V = 8u;
layout(constant_id = 4) const bool VEC_STORE = false;   // float32: the V outputs as two vec4s
layout(constant_id = 5) const int MODE = 0;      // 0 nearest neighbour, 1 linear
layout(constant_id = 6) const uint LIN_MASK = 0u;  // bit d: dimension d interpolated

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];
    uvec4 in_stride[2];
    uvec4 in_size[2];
    vec4 coord_a[2];              // x = o * a + b per dimension
    vec4 coord_b[2];
};

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // element index of the first bound element
    uint x_count;                 // invocations along x
    uvec4 magic[2];               // ceil(2^32 / extent): see divide()
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

// a / extent[d] for a < 2^16 (grid.py keeps grid coordinates below it): a multiply-high,
// a vector instruction where a division is one scalar division per lane on lavapipe.
uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

// Input indices (i0, i1) and weight w of i1 for output coordinate o along dimension d.
void locate(int d, uint o, out uint i0, out uint i1, out float w) {
    precise float xf = float(o) * AT(coord_a, d) + AT(coord_b, d);
    xf = clamp(xf, -1.0, float(AT(in_size, d)));
    float f = floor(xf);
    float fr = xf - f;
    int i = int(f);
    int last = int(AT(in_size, d)) - 1;
    bool lin = MODE == 1 && ((LIN_MASK >> d) & 1u) != 0u;
    int n = lin ? i : i + (fr >= 0.5 ? 1 : 0);
    i0 = uint(clamp(n, 0, last));
    i1 = uint(clamp(i + 1, 0, last));
    w = lin ? fr : 0.0;
}

const int LAST = RANK - 1;
const uint CORNERS = 1u << uint(LAST);   // corners over the outer dimensions

uint coord[8];

void main() {
    uint gx = gl_GlobalInvocationID.x;
    const int YDIM = RANK - XDIMS - 1;
    // no early return: the uniform loads after a divergent one become per-lane gathers on
    // lavapipe (docs/DEVELOPING.md).  A lane past the box computes its last element's
    // reads (inside the box, so inside a window's bindings) and stores nothing.
    bool live = gx < x_count && (YDIM < 0 || gl_GlobalInvocationID.y < AT(extent, YDIM));
    gx = min(gx, x_count - 1u);
    uint gy = YDIM >= 0 ? min(gl_GlobalInvocationID.y, AT(extent, max(YDIM, 0)) - 1u) : 0u;
    uint z = gl_GlobalInvocationID.z;
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) coord[YDIM] = AT(origin, YDIM) + gy;
    [[unroll]] for (int d = LAST; d > YDIM; d--) {
        if (d == YDIM + 1) {          // the outermost x dimension: gx < its extent
            coord[d] = AT(origin, d) + gx * V;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
    uint count = live ? min(V, AT(origin, LAST) + AT(extent, LAST) - coord[LAST]) : 0u;

    // the outer dimensions: two input offsets and a weight each
    uint off0[4], off1[4];
    float wt[4];
    uint out_off = 0u;
    [[unroll]] for (int d = 0; d < LAST; d++) {
        uint i0, i1;
        locate(d, coord[d], i0, i1, wt[d]);
        off0[d] = i0 * AT(in_stride, d);
        off1[d] = i1 * AT(in_stride, d);
        out_off += coord[d] * AT(out_stride, d);
    }
    // the last dimension: V outputs
    uint l0[8], l1[8];
    float lw[8];
    [[unroll]] for (uint j = 0u; j < V; j++) {
        uint i0, i1;
        locate(LAST, coord[LAST] + j, i0, i1, lw[j]);
        l0[j] = i0 * AT(in_stride, LAST);
        l1[j] = i1 * AT(in_stride, LAST);
    }
    out_off += coord[LAST] * AT(out_stride, LAST) - out_base;
    uint ostep = AT(out_stride, LAST);
    if (MODE == 0) {                  // nearest: one corner, the element's bits
        uint off = 0u;
        [[unroll]] for (int d = 0; d < LAST; d++) off += off0[d];
        off -= in_base;
        uint bits[8];
        [[unroll]] for (uint j = 0u; j < V; j++) bits[j] = LOADB(off + l0[j]);
#ifdef F32
        if (VEC_STORE && count == V) {    // out_off a multiple of 4
            uvec4 lo = uvec4(bits[0], bits[1], bits[2], bits[3]);
            uvec4 hi = uvec4(bits[4], bits[5], bits[6], bits[7]);
            STORE8(out_off, lo, hi) {
                y4[out_off >> 2] = uintBitsToFloat(lo);
                y4[(out_off >> 2) + 1u] = uintBitsToFloat(hi);
            }
            return;
        }
#endif
        [[unroll]] for (uint j = 0u; j < V; j++) {
            if (j < count) STOREB(out_off + j * ostep, bits[j]);
        }
        return;
    }
    const bool LIN_LAST = ((LIN_MASK >> LAST) & 1u) != 0u;
    float acc[8];
    [[unroll]] for (uint c = 0u; c < CORNERS; c++) {
        if ((c & ~LIN_MASK) != 0u) continue;    // corners of interpolated dimensions only
        uint off = 0u;
        float weight = 1.0;
        [[unroll]] for (int d = 0; d < LAST; d++) {
            bool hi = ((c >> d) & 1u) != 0u;
            off += hi ? off1[d] : off0[d];
            weight *= hi ? wt[d] : 1.0 - wt[d];
        }
        off -= in_base;
        [[unroll]] for (uint j = 0u; j < V; j++) {
            float v = LOAD(off + l0[j]);
            if (LIN_LAST) v = (1.0 - lw[j]) * v + lw[j] * LOAD(off + l1[j]);
            acc[j] = c == 0u ? weight * v : acc[j] + weight * v;
        }
    }
#ifdef F32
    if (VEC_STORE && count == V) {
        vec4 lo = vec4(acc[0], acc[1], acc[2], acc[3]), hi = vec4(acc[4], acc[5], acc[6], acc[7]);
        STORE8(out_off, floatBitsToUint(lo), floatBitsToUint(hi)) {
            y4[out_off >> 2] = lo;
            y4[(out_off >> 2) + 1u] = hi;
        }
        return;
    }
#endif
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) STORE(out_off + j * ostep, acc[j]);
    }
}
