#version 450
// DML_GEMM: Y = act(alpha * op(A) x op(B) + beta * C), one product per (batch, channel)
// pair.  Every tensor is read through its own element strides (the host swaps A's and
// B's last two for a transform and gives 0 for a broadcast dimension), so transposed,
// strided and broadcast operands need no copy.
//
// Three families, one text:
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
//   SSBO4 reads the same vec4s from storage buffers, for operands past the device's
//   maxTexelBufferElements (SwiftShader's 65536 texels: a 1024 x 1024 operand), keeping
//   the 8 x 8 block there: slower than texels, faster than DIRECT's scalar loads.
// * SGA (float32): the convolution's gemm_sg inner loop (convolution_gemm.comp, SGW) for
//   a plain product.  The SG lanes of a subgroup share MB rows of op(A) and each take NB
//   consecutive columns of op(B).  Per 4 k a lane fetches its share of the MB x 4 block
//   of A (R32F elements, or RGBA32F texels of 4 k: A_MODE) and gets the rest from the
//   other lanes by subgroup shuffles at constant lanes; it fetches its NB x 4 block of
//   B as RGBA32F texels along N or along K (B_MODE 1, 2) or R32F elements (0), and adds
//   MB x NB x 4 products, the 4 k of one accumulator in a row (lavapipe keeps the block
//   in memory: one load and store of an accumulator per 4 FMAs, where the convolution
//   kernel's order, every product of one k before the next k, takes one per FMA and
//   runs about half as fast).  On lavapipe a texel
//   fetch costs the same whether its address is uniform or not, so sharing A turns MB
//   fetches per k per lane into MB / SG.  The subgroups of a workgroup take consecutive
//   row blocks of the same columns (B's rows stay in cache).  KB > 0: the subgroups meet
//   at a workgroup barrier every KB k.  lavapipe runs a workgroup's subgroups one after
//   the other on one thread, each through the whole K without barriers, so each re-reads
//   the workgroup's K x SG*NB panel of B from memory where the panel outgrows the core's
//   caches (a 1024-row panel at a 4 KB row stride); at a barrier it switches to the next
//   subgroup, so each KB x SG*NB piece is read by all of them while it is in cache.  K
//   past the last whole 4 is one guarded step.  YV4: rows stored 4 columns a vec4
//   (lavapipe stores a vector in one lane turn, a scalar in one turn each).  A subgroup
//   past the last row returns early, or with KB > 0 skips its steps and still meets the
//   barriers.
// Arithmetic is float32 for every storage type (float16 stored as halves, or packed two
// to a word without 16-bit storage).  TEXEL variants read float32 A and B as R32F texels:
// lavapipe gathers texel fetches across lanes but runs storage-buffer loads one lane at a
// time.  TILED has no early return: every invocation reaches the barriers.
//
// vkml:variant gemm_tiled_f32 F32=1
// vkml:variant gemm_tiled_f32_texel F32=1 TEXEL=1
// vkml:variant gemm_tiled_f16 F16=1
// vkml:variant gemm_tiled_f16_packed F16_PACKED=1
// vkml:variant gemm_direct_f32 F32=1 DIRECT=1
// vkml:variant gemm_direct_f32_texel F32=1 TEXEL=1 DIRECT=1
// vkml:variant gemm_direct_f32_texel4 F32=1 TEXEL4=1 DIRECT=1
// vkml:variant gemm_direct_f32_ssbo4 F32=1 TEXEL4=1 SSBO4=1 DIRECT=1
// vkml:variant gemm_direct_f16 F16=1 DIRECT=1
// vkml:variant gemm_direct_f16_packed F16_PACKED=1 DIRECT=1
// vkml:variant gemm_sg_f32 F32=1 SGA=1
#extension GL_EXT_control_flow_attributes : enable
#ifdef SGA
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

#if defined(SGA)
layout(set = 0, binding = 0) uniform samplerBuffer At;     // R32F, RGBA32F for A_MODE 1
layout(set = 0, binding = 1) uniform samplerBuffer Bt;     // R32F, RGBA32F for B_MODE 1, 2
#elif defined(TEXEL4) && defined(SSBO4)
layout(std430, set = 0, binding = 0) readonly buffer InA4 { vec4 a4[]; };
layout(std430, set = 0, binding = 1) readonly buffer InB4 { vec4 b4[]; };
#define FETCH4_A(i) a4[i]
#define FETCH4_B(i) b4[i]
#elif defined(TEXEL4)
layout(set = 0, binding = 0) uniform samplerBuffer At;     // RGBA32F: 4 elements a texel
layout(set = 0, binding = 1) uniform samplerBuffer Bt;
#define FETCH4_A(i) texelFetch(At, int(i))
#define FETCH4_B(i) texelFetch(Bt, int(i))
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
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case; MB and NB stay specialization
// constants: frozen, SwiftShader unrolls the large blocks and spills.
// vkml:frozen ACT
layout(constant_id = 3) const int ACT = 0;       // ACT_* of vkml_activation.glsl
#ifdef SGA
layout(std430, set = 0, binding = 3) buffer Out4 { vec4 y4[]; };
layout(constant_id = 4) const int MB = 16;       // rows a subgroup (each of its lanes)
layout(constant_id = 5) const int NB = 8;        // columns a lane, a multiple of 4
layout(constant_id = 6) const int SG = 8;        // subgroup size (full subgroups)
layout(constant_id = 7) const int A_MODE = 0;    // 0: R32F elements; 1: RGBA32F, 4 k a texel
layout(constant_id = 8) const int B_MODE = 0;    // 0: R32F; 1: RGBA32F along N; 2: along K
layout(constant_id = 9) const bool YV4 = false;  // y contiguous along N, 4-aligned rows
layout(constant_id = 10) const int KB = 0;       // k between workgroup barriers (0: none), a multiple of 4
#endif

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
#if !defined(DIRECT) && !defined(SGA)
const uint KT = 16u;
shared vec4 As[KT][LY];           // As[k][r] = op(A) rows 4r..4r+3 at column k
shared vec4 Bs[KT][LX];           // Bs[k][q] = op(B) columns 4q..4q+3 at row k
#endif

#ifdef SGA
const int NV = NB / 4;                                // vec4s of columns a lane
const int AS = A_MODE == 1 ? MB : 4 * MB;             // A slots per 4 k: texels or elements
const int GW = (AS + SG - 1) / SG;                    // slots a lane fetches

// One step of 4 k from k0 (GUARD: the last, partial one; k past K read as 0).  A slot e
// = g * SG + lane: row e (A_MODE 1, its 4 k one texel) or row e / 4 at k e % 4.
#define SG_STEP(k0, GUARD) { \
    vec4 wl[GW]; \
    [[unroll]] for (int g = 0; g < GW; g++) { \
        if (A_MODE == 1) { \
            wl[g] = texelFetch(At, int(aoff[g] + (k0) / 4u)); \
        } else { \
            uint kk = (k0) + akq[g]; \
            wl[g].x = texelFetch(At, int(aoff[g] + min(kk, kn - 1u) * sa.w)).x; \
            if (GUARD && kk >= kn) wl[g].x = 0.0; \
        } \
    } \
    vec4 bv[4][NV]; \
    if (B_MODE == 2) { \
        [[unroll]] for (int j = 0; j < NB; j++) { \
            vec4 t = texelFetch(Bt, int(boff[j] + (k0) / 4u)); \
            [[unroll]] for (int q = 0; q < 4; q++) bv[q][j / 4][j % 4] = t[q]; \
        } \
    } else { \
        [[unroll]] for (int q = 0; q < 4; q++) { \
            uint kk = (k0) + uint(q); \
            uint kr = GUARD ? min(kk, kn - 1u) : kk; \
            [[unroll]] for (int v = 0; v < NV; v++) { \
                if (B_MODE == 1) { \
                    bv[q][v] = texelFetch(Bt, int(boff[v] + kr * (sb.z >> 2))); \
                } else { \
                    [[unroll]] for (int c = 0; c < 4; c++) \
                        bv[q][v][c] = texelFetch(Bt, int(boff[4 * v + c] + kr * sb.z)).x; \
                } \
                if (GUARD && kk >= kn) bv[q][v] = vec4(0.0); \
            } \
        } \
    } \
    [[unroll]] for (int i = 0; i < MB; i++) { \
        float a[4]; \
        [[unroll]] for (int q = 0; q < 4; q++) { \
            int e = A_MODE == 1 ? i : 4 * i + q; \
            a[q] = subgroupShuffle(A_MODE == 1 ? wl[e / SG][q] : wl[e / SG].x, uint(e % SG)); \
        } \
        [[unroll]] for (int v = 0; v < NV; v++) { \
            vec4 s = acc[i][v]; \
            [[unroll]] for (int q = 0; q < 4; q++) s = fma(vec4(a[q]), bv[q][v], s); \
            acc[i][v] = s; \
        } \
    } }

void main() {
    uint sl = gl_SubgroupInvocationID;
    uvec4 at = origin + uvec4(gl_WorkGroupID.z / extent.y, gl_WorkGroupID.z % extent.y, 0u, 0u);
    uvec4 end = origin + extent;
    uint m0 = origin.z + (gl_WorkGroupID.y * (LX / uint(SG)) + gl_SubgroupID) * uint(MB);
    uint n0 = origin.w + (gl_WorkGroupID.x * uint(SG) + sl) * uint(NB);
    bool live = m0 < end.z;       // (whole subgroups: a subgroup's lanes share their rows)
    if (KB == 0 && !live) return;
    uint kn = k_size;
    uvec4 sa = a_stride, sb = b_stride;
    uint abase = at.x * sa.x + at.y * sa.y - a_base;
    uint bbase = at.x * sb.x + at.y * sb.y - b_base;
    // rows and columns past the end clamped to the last (their results never stored)
    uint aoff[GW], akq[GW];
    [[unroll]] for (int g = 0; g < GW; g++) {
        int e = min(g * SG + int(sl), AS - 1);
        uint row = min(m0 + uint(A_MODE == 1 ? e : e / 4), end.z - 1u);
        aoff[g] = A_MODE == 1 ? (abase + row * sa.z) >> 2 : abase + row * sa.z;
        akq[g] = uint(e & 3);
    }
    uint boff[NB];                // B_MODE 1: texel of each vec4 at k 0; else of each column
    [[unroll]] for (int j = 0; j < NB; j++) {
        uint col = min(n0 + uint(j), end.w - 1u);
        if (B_MODE == 1) boff[j] = (bbase + min(n0 + 4u * uint(j), end.w - 4u)) >> 2;
        else boff[j] = B_MODE == 2 ? (bbase + col * sb.w) >> 2 : bbase + col * sb.w;
    }
    vec4 acc[MB][NV];
    [[unroll]] for (int i = 0; i < MB; i++)
        [[unroll]] for (int v = 0; v < NV; v++) acc[i][v] = vec4(0.0);
    uint kw = kn & ~3u;
    if (KB == 0) {
        [[dont_unroll]] for (uint k0 = 0u; k0 < kw; k0 += 4u) SG_STEP(k0, false)
    } else {
        [[dont_unroll]] for (uint kb = 0u; kb < kw; kb += uint(KB)) {
            if (live) {
                uint ke = min(kb + uint(KB), kw);
                [[dont_unroll]] for (uint k0 = kb; k0 < ke; k0 += 4u) SG_STEP(k0, false)
            }
            barrier();
        }
    }
    if (!live) return;
    if (kw < kn) SG_STEP(kw, true)
    if (n0 >= end.w) return;

    float al = alpha, be = beta;
    vec4 prm = act_params;
    uvec4 sc = c_stride, sy = y_stride;
    uint cb = at.x * sc.x + at.y * sc.y - c_base;
    uint yb = at.x * sy.x + at.y * sy.y - y_base;
    [[unroll]] for (int i = 0; i < MB; i++) {
        uint m = m0 + uint(i);
        if (m >= end.z) break;
        [[unroll]] for (int v = 0; v < NV; v++) {
            uint n = n0 + 4u * uint(v);
            vec4 o = al * acc[i][v];
            if (YV4) {            // (N a multiple of 4: a vec4 is whole or past the end)
                if (n < end.w) {
                    if (HAS_C) {
                        uint ci = cb + m * sc.z + n * sc.w;
                        o += be * vec4(FLOAD(c, ci), FLOAD(c, ci + sc.w),
                                       FLOAD(c, ci + 2u * sc.w), FLOAD(c, ci + 3u * sc.w));
                    }
                    y4[(yb + m * sy.z + n) >> 2] = vec4(
                        vkml_activation(ACT, o.x, prm), vkml_activation(ACT, o.y, prm),
                        vkml_activation(ACT, o.z, prm), vkml_activation(ACT, o.w, prm));
                }
            } else {
                [[unroll]] for (int c4 = 0; c4 < 4; c4++) {
                    uint nc = n + uint(c4);
                    if (nc < end.w) {
                        float r = o[c4];
                        if (HAS_C) r += be * FLOAD(c, cb + m * sc.z + nc * sc.w);
                        FSTORE(y, yb + m * sy.z + nc * sy.w, vkml_activation(ACT, r, prm));
                    }
                }
            }
        }
    }
}
#else
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
                bv[4u * v + r] = FETCH4_B(q + r * kstep);
        }
        [[unroll]] for (uint i = 0u; i < RM; i++) {
            vec4 av = FETCH4_A(ra[i] + kq);
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
#endif
