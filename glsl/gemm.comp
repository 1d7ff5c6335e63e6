#version 450
// DML_GEMM: Y = act(alpha * op(A) x op(B) + beta * C), one product per (batch, channel)
// pair.  Every tensor is read through its own element strides (the host swaps A's and
// B's last two for a transform and gives 0 for a broadcast dimension), so transposed,
// strided and broadcast operands need no copy.
//
// Two families, one text:
// * TILED: a workgroup of LX x LY invocations computes a (4*LY) x (4*LX) block of Y;
//   each K step of KT stages op(A)'s (4*LY) x KT and op(B)'s KT x (4*LX) slices in
//   shared memory (out-of-range elements as 0, so the inner loop has no bounds tests),
//   and each invocation accumulates a 4 x 4 block as four vec4 rows: per k two vec4
//   shared loads feed 16 FMAs.  Suits devices with fast shared memory.
// * DIRECT: no shared memory and no barriers; each invocation reads its own 4 rows of
//   op(A) and 4 columns of op(B) per k (rows and columns past the end clamped to the
//   last, their results never stored).  On lavapipe barriers and shared memory cost more
//   than the reuse saves.  TEXEL4 reads A along K and B along N as RGBA32F texels (the
//   host's rule: both contiguous there, K and N multiples of 4, every other stride and
//   base 4-aligned) and takes an 8 x 8 block: per 4 k, 16 vec4 fetches feed 256 FMAs.
// Arithmetic is float32 for every storage type (float16 stored as halves, or packed two
// to a word without 16-bit storage).  TEXEL variants read float32 A and B as R32F texels:
// lavapipe gathers texel fetches across lanes but runs storage-buffer loads one lane at a
// time.  No early return: every invocation reaches the barriers.
//
// vkml:variant gemm_tiled_f32 F32=1
// vkml:variant gemm_tiled_f32_texel F32=1 TEXEL=1
// vkml:variant gemm_tiled_f16 F16=1
// vkml:variant gemm_tiled_f16_packed F16_PACKED=1
// vkml:variant gemm_direct_f32 F32=1 DIRECT=1
// vkml:variant gemm_direct_f32_texel F32=1 TEXEL=1 DIRECT=1
// vkml:variant gemm_direct_f32_texel4 F32=1 TEXEL4=1 DIRECT=1
// vkml:variant gemm_direct_f16 F16=1 DIRECT=1
// vkml:variant gemm_direct_f16_packed F16_PACKED=1 DIRECT=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

#if defined(TEXEL4)
layout(set = 0, binding = 0) uniform samplerBuffer At;     // RGBA32F: 4 elements a texel
layout(set = 0, binding = 1) uniform samplerBuffer Bt;
#elif defined(TEXEL)
layout(set = 0, binding = 0) uniform samplerBuffer At;
layout(set = 0, binding = 1) uniform samplerBuffer Bt;
#define LOADA(i) texelFetch(At, int(i)).x
#define LOADB(i) texelFetch(Bt, int(i)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer InA { FSTORE_T a[]; };
layout(std430, set = 0, binding = 1) readonly buffer InB { FSTORE_T b[]; };
#define LOADA(i) FLOAD(a, i)
#define LOADB(i) FLOAD(b, i)
#endif
layout(std430, set = 0, binding = 2) readonly buffer InC { FSTORE_T c[]; };
layout(std430, set = 0, binding = 3) buffer Out { FSTORE_T y[]; };

layout(local_size_x_id = 0, local_size_y_id = 1) in;
layout(constant_id = 2) const bool HAS_C = false;
layout(constant_id = 3) const int ACT = 0;       // ACT_* of vkml_activation.glsl

layout(std140, set = 0, binding = 4) uniform Params {
    uvec4 a_stride;               // (batch, channel, m, k) in elements, op(A)'s
    uvec4 b_stride;               // (batch, channel, k, n), op(B)'s
    uvec4 c_stride;               // (batch, channel, m, n)
    uvec4 y_stride;
    vec4 act_params;              // the fused activation's (kernel_parameters())
    float alpha, beta;
    uint k_size;
};

layout(push_constant) uniform Push {
    uvec4 origin;                 // (batch, channel, m, n) of this dispatch's box
    uvec4 extent;
    uint a_base, b_base, c_base, y_base;   // element index of each binding's first element
};

const uint LX = gl_WorkGroupSize.x, LY = gl_WorkGroupSize.y;
#ifdef TEXEL4
const uint RM = 8u, CV = 2u;      // texel4: 8 rows x 8 columns, more reuse per fetch
#else
const uint RM = 4u, CV = 1u;      // rows, vec4s of columns an invocation
#endif
const uint BM = RM * LY, BN = 4u * CV * LX;
#ifndef DIRECT
const uint KT = 16u;
shared vec4 As[KT][LY];           // As[k][r] = op(A) rows 4r..4r+3 at column k
shared vec4 Bs[KT][LX];           // Bs[k][q] = op(B) columns 4q..4q+3 at row k
#endif

void main() {
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint tid = ty * LX + tx;
    uint zc = gl_WorkGroupID.z % extent.y;
    uvec4 at = origin + uvec4(gl_WorkGroupID.z / extent.y, zc, gl_WorkGroupID.y * BM,
                              gl_WorkGroupID.x * BN);
    uvec4 end = origin + extent;
    float al = alpha, be = beta;
    uint kn = k_size;
    uvec4 sa = a_stride, sb = b_stride;
    uint abase = at.x * sa.x + at.y * sa.y - a_base;
    uint bbase = at.x * sb.x + at.y * sb.y - b_base;
    vec4 acc[RM * CV];            // acc[i * CV + v]: row i, columns 4v..4v+3
    [[unroll]] for (uint i = 0u; i < RM * CV; i++) acc[i] = vec4(0.0);
#if defined(DIRECT) && defined(TEXEL4)
    uint m0 = at.z + RM * ty, n0 = at.w + 4u * CV * tx;
    uint ra[RM], bq[CV];
    [[unroll]] for (uint i = 0u; i < RM; i++) ra[i] = (abase + min(m0 + i, end.z - 1u) * sa.z) >> 2;
    uint kstep = sb.z >> 2;
    [[unroll]] for (uint v = 0u; v < CV; v++) bq[v] = (bbase + min(n0 + 4u * v, end.w - 4u)) >> 2;
    for (uint kq = 0u; kq < kn / 4u; kq++) {
        vec4 bv[4 * CV];
        [[unroll]] for (uint v = 0u; v < CV; v++) {
            uint q = bq[v] + 4u * kq * kstep;
            [[unroll]] for (uint r = 0u; r < 4u; r++)
                bv[4u * v + r] = texelFetch(Bt, int(q + r * kstep));
        }
        [[unroll]] for (uint i = 0u; i < RM; i++) {
            vec4 av = texelFetch(At, int(ra[i] + kq));
            [[unroll]] for (uint v = 0u; v < CV; v++)
                acc[i * CV + v] += av.x * bv[4u * v] + av.y * bv[4u * v + 1u]
                                 + av.z * bv[4u * v + 2u] + av.w * bv[4u * v + 3u];
        }
    }
#elif defined(DIRECT)
    uint m0 = at.z + 4u * ty, n0 = at.w + 4u * tx;
    uint ra[4], rb[4];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        ra[i] = abase + min(m0 + i, end.z - 1u) * sa.z;
        rb[i] = bbase + min(n0 + i, end.w - 1u) * sb.w;
    }
    for (uint kk = 0u; kk < kn; kk++) {
        uint ka = kk * sa.w, kb = kk * sb.z;
        vec4 av = vec4(LOADA(ra[0] + ka), LOADA(ra[1] + ka), LOADA(ra[2] + ka), LOADA(ra[3] + ka));
        vec4 bv = vec4(LOADB(rb[0] + kb), LOADB(rb[1] + kb), LOADB(rb[2] + kb), LOADB(rb[3] + kb));
        acc[0] += av.x * bv;
        acc[1] += av.y * bv;
        acc[2] += av.z * bv;
        acc[3] += av.w * bv;
    }
#else
    for (uint k0 = 0u; k0 < kn; k0 += KT) {
        // op(A): BM x KT elements, consecutive invocations on consecutive rows
        [[unroll]] for (uint e = tid; e < BM * KT; e += LX * LY) {
            uint r = e % BM, k = e / BM;
            uint m = at.z + r, kk = k0 + k;
            float v = 0.0;
            if (m < end.z && kk < kn) v = LOADA(abase + m * sa.z + kk * sa.w);
            As[k][r >> 2][r & 3u] = v;
        }
        // op(B): KT x BN elements, consecutive invocations on consecutive columns
        [[unroll]] for (uint e = tid; e < BN * KT; e += LX * LY) {
            uint q = e % BN, k = e / BN;
            uint n = at.w + q, kk = k0 + k;
            float v = 0.0;
            if (n < end.w && kk < kn) v = LOADB(bbase + kk * sb.z + n * sb.w);
            Bs[k][q >> 2][q & 3u] = v;
        }
        barrier();
        [[unroll]] for (uint k = 0u; k < KT; k++) {
            vec4 av = As[k][ty], bv = Bs[k][tx];
            acc[0] += av.x * bv;
            acc[1] += av.y * bv;
            acc[2] += av.z * bv;
            acc[3] += av.w * bv;
        }
        barrier();
    }
#endif
    vec4 prm = act_params;
    uvec4 sc = c_stride, sy = y_stride;
    uint cb = at.x * sc.x + at.y * sc.y - c_base;
    uint yb = at.x * sy.x + at.y * sy.y - y_base;
    [[unroll]] for (uint i = 0u; i < RM; i++) {
        uint m = at.z + RM * ty + i;
        [[unroll]] for (uint j = 0u; j < 4u * CV; j++) {
            uint n = at.w + 4u * CV * tx + j;
            if (m < end.z && n < end.w) {
                float v = al * acc[i * CV + j / 4u][j & 3u];
                if (HAS_C) v += be * FLOAD(c, cb + m * sc.z + n * sc.w);
                FSTORE(y, yb + m * sy.z + n * sy.w, vkml_activation(ACT, v, prm));
            }
        }
    }
}
