#version 450
// DML_BATCH_NORMALIZATION: Y = act(Scale * (X - Mean) / sqrt(Variance + Epsilon) + Bias)
// for every element of the output box, each of the six tensors through its own element
// strides (0: a broadcast statistic).  Arithmetic in float32 for float32 and float16
// tensors (float16 stored as halves, or packed two to a 32-bit word without 16-bit
// storage); the fused activation is vkml_activation() with ACT frozen by the host.
//
// The grid is a box kernel's (vkml/ops/grid.py): x along the trailing dimension(s), V
// elements of the last dimension an invocation, y the one before, z the rest, so all but
// x is the same for a workgroup.  ROW variants are for statistics constant along the last
// dimension (the usual per-channel ones, whose last dimension is the merged spatial
// one): the four are loaded once an invocation, folded into one multiply and add, and
// reused for its V elements (storage-buffer loads go one lane at a time on lavapipe).
// The others load the statistics of each element.  With VEC_STORE (float32, every
// invocation's V elements packed and 4-aligned in X and Y) X is read and Y written as
// vec4s (float16: half pairs).  TEXEL4 variants read float32 X as RGBA32F texels and
// the statistics as R32F texels (lavapipe vectorizes texel reads; its storage-buffer
// loads go one lane at a time).  U64 variants (TEXEL4 with VEC_STORE, every invocation's
// elements 8-aligned in Y) store each pair of vec4s as one u64vec4: lavapipe stores a
// vector one component at a time, so 64-bit components halve the store turns.
// No early return before the uniform loads (docs/DEVELOPING.md).
//
// vkml:variant batch_normalization_f32 F32=1
// vkml:variant batch_normalization_f16 F16=1
// vkml:variant batch_normalization_f16_packed F16_PACKED=1
// vkml:variant batch_normalization_f32_row F32=1 ROW=1
// vkml:variant batch_normalization_f16_row F16=1 ROW=1
// vkml:variant batch_normalization_f16_packed_row F16_PACKED=1 ROW=1
// vkml:variant batch_normalization_f32_texel4 F32=1 TEXEL4=1
// vkml:variant batch_normalization_f32_row_texel4 F32=1 ROW=1 TEXEL4=1
// vkml:variant batch_normalization_f32_texel4_u64 F32=1 TEXEL4=1 U64=1
// vkml:variant batch_normalization_f32_row_texel4_u64 F32=1 ROW=1 TEXEL4=1 U64=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#include "vkml_activation.glsl"
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif

#ifdef TEXEL4
layout(set = 0, binding = 0) uniform samplerBuffer Xt;     // RGBA32F: 4 elements a texel
#define LOADX(i) texelFetch(Xt, int((i) >> 2))[(i) & 3u]
#define LOADX4(q) texelFetch(Xt, int(q))
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
#define LOADX(i) FLOAD(x, i)
#endif
#if defined(F32) && !defined(TEXEL4)
layout(std430, set = 0, binding = 0) readonly buffer In4 { vec4 x4[]; };
#define LOADX4(q) x4[q]
#endif
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };
#ifdef F32
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#endif
#ifdef U64
layout(std430, set = 0, binding = 1) buffer Out8 { u64vec4 y8[]; };
#endif
#ifdef TEXEL4
// the statistics as R32F texels too (a storage-buffer load per invocation cost lavapipe
// more than the texel fetch)
layout(set = 0, binding = 3) uniform samplerBuffer mean;
layout(set = 0, binding = 4) uniform samplerBuffer variance;
layout(set = 0, binding = 5) uniform samplerBuffer scale;
layout(set = 0, binding = 6) uniform samplerBuffer bias;
#define LOADS(B, i) texelFetch(B, int(i)).x
#else
layout(std430, set = 0, binding = 3) readonly buffer Mean { FSTORE_T mean[]; };
layout(std430, set = 0, binding = 4) readonly buffer Var { FSTORE_T variance[]; };
layout(std430, set = 0, binding = 5) readonly buffer Scale { FSTORE_T scale[]; };
layout(std430, set = 0, binding = 6) readonly buffer Bias { FSTORE_T bias[]; };
#define LOADS(B, i) FLOAD(B, i)
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 1 to 8 dimensions
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 21) const uint V = 1u;      // elements of the last dimension per invocation
layout(constant_id = 22) const bool VEC_STORE = false;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case.
// vkml:frozen ACT
layout(constant_id = 24) const int ACT = 0;      // ACT_* of vkml_activation.glsl

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per dimension, in elements
    uvec4 in_stride[2];
    uvec4 mean_stride[2];
    uvec4 var_stride[2];
    uvec4 scale_stride[2];
    uvec4 bias_stride[2];
    vec4 act_params;              // the fused activation's (kernel_parameters())
    float epsilon;
};

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uvec4 magic[2];               // ceil(2^32 / extent): see divide()
    uint in_base, out_base;       // element index of the first bound element
    uint mean_base, var_base, scale_base, bias_base;
    uint x_count;                 // invocations along x
    uint pad_;
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

// a / extent[d] for a < 2^16 (the host keeps grid coordinates below it)
uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

const int LAST = RANK - 1;

float normalize_one(float v, float m, float var, float sc, float b, float eps, vec4 prm) {
    return vkml_activation(ACT, sc * ((v - m) * inversesqrt(var + eps)) + b, prm);
}

void main() {
    uint gx = gl_GlobalInvocationID.x;
    const int YDIM = RANK - XDIMS - 1;
    bool live = gx < x_count && (YDIM < 0 || gl_GlobalInvocationID.y < AT(extent, YDIM));
    vec4 prm = act_params;
    float eps = epsilon;
    uint coord[8];
    uint z = gl_GlobalInvocationID.z;
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) coord[YDIM] = AT(origin, YDIM) + gl_GlobalInvocationID.y;
    [[unroll]] for (int d = LAST; d > YDIM; d--) {
        if (d == YDIM + 1) {
            coord[d] = AT(origin, d) + gx * V;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
    uint end = AT(origin, LAST) + AT(extent, LAST);
    uint count = live && coord[LAST] < end ? min(V, end - coord[LAST]) : 0u;
    uint s = 0u, o = 0u, sm = 0u, sv = 0u, ss = 0u, sb = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        s += coord[d] * AT(in_stride, d);
        o += coord[d] * AT(out_stride, d);
        sm += coord[d] * AT(mean_stride, d);
        sv += coord[d] * AT(var_stride, d);
        ss += coord[d] * AT(scale_stride, d);
        sb += coord[d] * AT(bias_stride, d);
    }
    s -= in_base; o -= out_base;
    sm -= mean_base; sv -= var_base; ss -= scale_base; sb -= bias_base;
#ifdef ROW
    // per-channel statistics: Y = act((X - Mean) * a + Bias), a = Scale / sqrt(Var + eps)
    float m = 0.0, a = 0.0, b = 0.0;
    if (count > 0u) {
        m = LOADS(mean, sm);
        a = LOADS(scale, ss) * inversesqrt(LOADS(variance, sv) + eps);
        b = LOADS(bias, sb);
    }
#define NORM(v, j) vkml_activation(ACT, ((v) - m) * a + b, prm)
#else
    uint mstep = AT(mean_stride, LAST), vstep = AT(var_stride, LAST);
    uint cstep = AT(scale_stride, LAST), bstep = AT(bias_stride, LAST);
#define NORM(v, j) normalize_one(v, LOADS(mean, sm + (j) * mstep), \
        LOADS(variance, sv + (j) * vstep), LOADS(scale, ss + (j) * cstep), \
        LOADS(bias, sb + (j) * bstep), eps, prm)
#endif
    if (VEC_STORE && count == V) {    // s and o multiples of 4 (the host's rule)
#ifdef U64
        // o a multiple of 8 and V of 8 (the host's rule): vec4 pairs as one u64vec4
        [[unroll]] for (uint k = 0u; k < V / 4u; k += 2u) {
            uint j = 4u * k;
            vec4 v = LOADX4((s >> 2) + k), w = LOADX4((s >> 2) + k + 1u);
            v = vec4(NORM(v.x, j), NORM(v.y, j + 1u), NORM(v.z, j + 2u), NORM(v.w, j + 3u));
            w = vec4(NORM(w.x, j + 4u), NORM(w.y, j + 5u), NORM(w.z, j + 6u),
                     NORM(w.w, j + 7u));
            y8[(o >> 3) + k / 2u] = vkml_u64x4(floatBitsToUint(v), floatBitsToUint(w));
        }
#else
        [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
            uint j = 4u * k;
#ifdef F32
            vec4 v = LOADX4((s >> 2) + k);
            y4[(o >> 2) + k] = vec4(NORM(v.x, j), NORM(v.y, j + 1u), NORM(v.z, j + 2u),
                                    NORM(v.w, j + 3u));
#else
            FSTORE2(y, o + j, NORM(FLOAD(x, s + j), j), NORM(FLOAD(x, s + j + 1u), j + 1u));
            FSTORE2(y, o + j + 2u, NORM(FLOAD(x, s + j + 2u), j + 2u),
                    NORM(FLOAD(x, s + j + 3u), j + 3u));
#endif
        }
#endif
    } else if (VEC_STORE) {           // a row's last invocation (or one past the row)
        // not unrolled: lavapipe runs an unrolled tail's V masked loads and stores in every
        // invocation of a SIMD group, even where none of its lanes takes this branch
        [[dont_unroll]] for (uint j = 0u; j < count; j++) {
            FSTORE(y, o + j, NORM(LOADX(s + j), j));
        }
    } else {
        uint istep = AT(in_stride, LAST), ostep = AT(out_stride, LAST);
        [[unroll]] for (uint j = 0u; j < V; j++) {
            if (j < count) FSTORE(y, o + j * ostep, NORM(LOADX(s + j * istep), j));
        }
    }
}
