#version 450
// DML_ACTIVATION_SOFTMAX / SOFTMAX1: Y = exp(X - max) / sum(exp(X - max)) over the
// reduced axes, one softmax per *row* (a combination of the kept coordinates).  The host
// merges dimensions first, so a row is RR reduced dimensions (usually one) and the rows a
// box of KR kept dimensions (one window of it per dispatch: origin/extent).
//
// Numerically stable and in float32 for float32 and float16 tensors: one pass keeps a
// running maximum m and the sum s of exp(x - m), rescaling s when m grows (so X is read
// twice, not three times); m starts at -FLT_MAX, not -inf, so a row starting with -inf
// (an attention mask) gives exp(0) * 0 rather than exp(-inf + inf) = NaN.  A second pass
// writes exp(x - m) / s.
//
// LANE variants: one invocation per row (rows with few elements, many rows).  GROUP
// variants: one workgroup per row, its invocations taking every LOCAL_SIZE_X-th element,
// their (m, s) pairs combined in shared memory (LOCAL_SIZE_X a power of two).  TEXEL
// variants read float32 X through an R32F uniform texel buffer (lavapipe vectorizes
// texel reads, not storage-buffer ones).
//
// TEXEL4 variants (float32 rows of one packed dimension, a multiple of 4 long, every row
// 4-aligned) read RGBA32F texels and store vec4s, four elements a step: lavapipe stores
// one lane at a time, a vec4 in one turn, so a scalar store per element costs 4x.
// SSBO4 variants do the same from a vec4 storage buffer.
//
// SG variants: one subgroup per row (SG lanes, the device's full subgroup size), its lanes
// taking every SG-th element (texel) of the row, so that the lanes of a SIMD group read
// neighbouring texels of one row rather than one texel each of SG rows, and combining
// their (m, s) pairs by subgroup shuffles: no shared memory and no barrier (the GROUP
// variants' tree of barriers is slow on the CPU drivers).  With HOLD (float32 TEXEL4 and
// SSBO4 rows short enough) the row is read once and kept in registers: hold_row().
//
// vkml:variant softmax_sg_f32 SG_ROW=1 F32=1
// vkml:variant softmax_sg_f32_texel4 SG_ROW=1 F32=1 TEXEL4=1
// vkml:variant softmax_sg_f32_ssbo4 SG_ROW=1 F32=1 TEXEL4=1 SSBO4=1
// vkml:variant softmax_sg_f32_texel4_u64 SG_ROW=1 F32=1 TEXEL4=1 U64=1
// vkml:variant softmax_sg_f32_ssbo4_u64 SG_ROW=1 F32=1 TEXEL4=1 SSBO4=1 U64=1
// vkml:variant softmax_sg_f32_texel SG_ROW=1 F32=1 TEXEL=1
// vkml:variant softmax_sg_f16 SG_ROW=1 F16=1
// vkml:variant softmax_sg_f16_packed SG_ROW=1 F16_PACKED=1
// vkml:variant softmax_lane_f32 LANE=1 F32=1
// vkml:variant softmax_lane_f32_texel4 LANE=1 F32=1 TEXEL4=1
// vkml:variant softmax_group_f32_texel4 GROUP=1 F32=1 TEXEL4=1
// vkml:variant softmax_lane_f32_ssbo4 LANE=1 F32=1 TEXEL4=1 SSBO4=1
// vkml:variant softmax_group_f32_ssbo4 GROUP=1 F32=1 TEXEL4=1 SSBO4=1
// vkml:variant softmax_lane_f32_texel LANE=1 F32=1 TEXEL=1
// vkml:variant softmax_lane_f16 LANE=1 F16=1
// vkml:variant softmax_lane_f16_packed LANE=1 F16_PACKED=1
// vkml:variant softmax_group_f32 GROUP=1 F32=1
// vkml:variant softmax_group_f32_texel GROUP=1 F32=1 TEXEL=1
// vkml:variant softmax_group_f16 GROUP=1 F16=1
// vkml:variant softmax_group_f16_packed GROUP=1 F16_PACKED=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#ifdef SG_ROW
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif

#if defined(SSBO4)
// the TEXEL4 reads as vec4 storage-buffer loads (inputs past maxTexelBufferElements
// texels: SwiftShader's 65536 hold 1 MiB)
layout(std430, set = 0, binding = 0) readonly buffer In4 { vec4 x4[]; };
#define LOADX(i) x4[(i) >> 2][(i) & 3u]
#define LOAD4(q) x4[q]
#elif defined(TEXEL4)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;     // RGBA32F: 4 elements a texel
#define LOADX(i) texelFetch(Xt, int((i) >> 2))[(i) & 3u]
#define LOAD4(q) texelFetch(Xt, int(q))
#elif defined(TEXEL)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define LOADX(i) texelFetch(Xt, int(i)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
#define LOADX(i) FLOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };
#ifdef TEXEL4
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#endif
#ifdef U64
layout(std430, set = 0, binding = 1) buffer Out8 { u64vec4 y8[]; };
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int KR = 1;        // kept dimensions (rows), 1 to 8
layout(constant_id = 2) const int RR = 1;        // reduced dimensions of a row, 1 to 8
layout(constant_id = 3) const uint SG = 8u;      // SG_ROW: the pipeline's subgroup size
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: HOLD and NREG: whether the "sg" path holds a
// row in registers and how many texels a lane (the held loops unroll over NREG).
// vkml:frozen HOLD NREG
layout(constant_id = 4) const bool HOLD = false; // SG_ROW TEXEL4: the row held by its lanes
layout(constant_id = 5) const uint NREG = 1u;    // HOLD: texels a lane holds (>= a row's / SG)

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 in_kstride[2];          // kept dimensions, in elements
    uvec4 out_kstride[2];
    uvec4 in_rstride[2];          // reduced dimensions
    uvec4 out_rstride[2];
    uvec4 rsize[2];               // sizes of the reduced dimensions
    uint count;                   // elements of a row: the product of rsize
};

layout(push_constant) uniform Push {
    uvec4 origin[2];              // this window of the kept box
    uvec4 extent[2];
    uint in_base, out_base;       // element index of the first bound element
    uint row_first;               // first row (in the window) of this dispatch
    uint rows;                    // rows in the window
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

const float FLT_LOWEST = -3.402823466e38;
#define NEG_INF uintBitsToFloat(0xFF800000u)

// Element offsets of reduced element j of a row (its coordinates, last dimension fastest).
void reduced_offsets(uint j, out uint si, out uint so) {
    si = 0u; so = 0u;
    [[unroll]] for (int d = RR - 1; d >= 0; d--) {
        uint c = j;
        if (d > 0) {
            uint q = j / AT(rsize, d);
            c = j - q * AT(rsize, d);
            j = q;
        }
        si += c * AT(in_rstride, d);
        so += c * AT(out_rstride, d);
    }
}

// Element offsets of a row's first element (relative to the bound windows).
void row_offsets(uint r, out uint si, out uint so) {
    si = 0u; so = 0u;
    [[unroll]] for (int d = KR - 1; d >= 0; d--) {
        uint c = r;
        if (d > 0) {
            uint q = r / AT(extent, d);
            c = r - q * AT(extent, d);
            r = q;
        }
        c += AT(origin, d);
        si += c * AT(in_kstride, d);
        so += c * AT(out_kstride, d);
    }
    si -= in_base;
    so -= out_base;
}

// Take v into (m, c, t): the running maximum m and the sum of exp(x - m) over the
// elements so far, kept as a chunk sum c (at most CHUNK terms) added into t, so the sum
// of a long row rounds like CHUNK + n / CHUNK additions, not n.
const uint CHUNK = 32u;
void accumulate(inout float m, inout float c, inout float t, float v, uint k) {
    float mn = max(m, v);
    float f = exp(m - mn);
    c = c * f + exp(v - mn);
    t *= f;
    m = mn;
    if (k % CHUNK == CHUNK - 1u) {
        t += c;
        c = 0.0;
    }
}

#if defined(SG_ROW) && defined(TEXEL4)
// The row read once: each lane holds its NREG texels in registers, so X is fetched once
// rather than twice (the fetches and stores, not exp, bound the two-pass loop on the CPU
// drivers), takes the row's maximum, then exp(x - max) once an element, kept for the
// stores.  Texels past the row are never fetched or stored.  A lane holds every
// SG-th texel; U64 variants (rows a multiple of 8 long, 8-aligned) every SG-th pair of
// texels, stored as one u64vec4 (lavapipe stores a vector one component at a time).
#ifdef U64
#define TEX(i) (2u * (lane + ((i) >> 1) * SG) + ((i) & 1u))
#else
#define TEX(i) (lane + (i) * SG)
#endif
void hold_row(uint xi, uint yo, uint end) {
    vec4 xr[NREG];
    vec4 mx = vec4(FLT_LOWEST);
    uint lane = gl_SubgroupInvocationID;
    // every texel fetched, past the row at the row's last one (a dead subgroup's at its
    // first), then replaced: a select, where a test around the fetch is a branch lavapipe
    // runs under a lane mask
    uint last = max(end, 1u) - 1u;
    vec4 lowest = vec4(NEG_INF);
    [[unroll]] for (uint i = 0u; i < NREG; i++) {
        vec4 v = LOAD4(xi + min(TEX(i), last));
        bool in_row = TEX(i) < end;
        xr[i] = in_row ? v : lowest;
        mx = max(mx, xr[i]);
    }
    float m = max(max(mx.x, mx.y), max(mx.z, mx.w));
    [[unroll]] for (uint o = SG / 2u; o > 0u; o >>= 1u)
        m = max(m, subgroupShuffleXor(m, o));
    // texels past the row hold -inf: exp(-inf - m) is 0 for every m the row can have
    // (at least FLT_LOWEST; a driver clamping exp's argument gives its smallest normal),
    // so they add nothing to the sum and need no test
    vec4 acc = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < NREG; i++) {
        xr[i] = exp(xr[i] - m);
        acc += xr[i];
    }
    float s = (acc.x + acc.y) + (acc.z + acc.w);
    [[unroll]] for (uint o = SG / 2u; o > 0u; o >>= 1u)
        s += subgroupShuffleXor(s, o);
    float inv = 1.0 / s;
#ifdef U64
    [[unroll]] for (uint i = 0u; i < NREG; i += 2u)
        if (TEX(i) < end)
            y8[(yo + TEX(i)) >> 1] = vkml_u64x4(floatBitsToUint(xr[i] * inv),
                                                floatBitsToUint(xr[i + 1u] * inv));
#else
    [[unroll]] for (uint i = 0u; i < NREG; i++)
        if (TEX(i) < end) y4[yo + TEX(i)] = xr[i] * inv;
#endif
}
#endif

#ifdef GROUP
shared float sh_m[gl_WorkGroupSize.x];
shared float sh_s[gl_WorkGroupSize.x];
#endif

void main() {
#ifdef LANE
    uint r = row_first + gl_GlobalInvocationID.x;
    uint first = 0u, step = 1u;
#elif defined(SG_ROW)
    uint r = row_first + gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint first = gl_SubgroupInvocationID, step = SG;
#else
    uint r = row_first + gl_WorkGroupID.x;
    uint first = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
#endif
    uint n = count;
    bool live = r < rows;
    uint bi, bo;
    row_offsets(live ? r : 0u, bi, bo);
    float m = FLT_LOWEST, c = 0.0, t = 0.0;
    uint end = live ? n : 0u;
    uint k = 0u;
#if defined(SG_ROW) && defined(TEXEL4)
    if (HOLD) {
        hold_row(bi >> 2, bo >> 2, end >> 2);
        return;
    }
#endif
#ifdef TEXEL4
    end >>= 2;                        // texels: one reduced dimension of unit stride
    for (uint j = first; j < end; j += step) {
        vec4 v = LOAD4((bi >> 2) + j);
        float mn = max(m, max(max(v.x, v.y), max(v.z, v.w)));
        float f = exp(m - mn);
        vec4 e = exp(v - mn);
        c = c * f + ((e.x + e.y) + (e.z + e.w));
        t *= f;
        m = mn;
        if (k++ % CHUNK == CHUNK - 1u) {
            t += c;
            c = 0.0;
        }
    }
#else
    for (uint j = first; j < end; j += step) {
        uint si, so;
        reduced_offsets(j, si, so);
        accumulate(m, c, t, LOADX(bi + si), k++);
    }
#endif
    float s = t + c;
#ifdef SG_ROW
    // every lane of a subgroup has the same row (live or not): all take part
    [[unroll]] for (uint o = SG / 2u; o > 0u; o >>= 1u) {
        float m2 = subgroupShuffleXor(m, o), s2 = subgroupShuffleXor(s, o);
        float mn = max(m, m2);
        s = s * exp(m - mn) + s2 * exp(m2 - mn);
        m = mn;
    }
#endif
#ifdef GROUP
    uint lid = gl_LocalInvocationID.x;
    sh_m[lid] = m;
    sh_s[lid] = s;
    barrier();
    [[unroll]] for (uint half_ = gl_WorkGroupSize.x / 2u; half_ > 0u; half_ >>= 1u) {
        if (lid < half_) {
            float m2 = sh_m[lid + half_], s2 = sh_s[lid + half_];
            float mn = max(m, m2);
            s = s * exp(m - mn) + s2 * exp(m2 - mn);
            m = mn;
            sh_m[lid] = m;
            sh_s[lid] = s;
        }
        barrier();
    }
    m = sh_m[0];
    s = sh_s[0];
#endif
    float inv = 1.0 / s;
#ifdef TEXEL4
    for (uint j = first; j < end; j += step)
        y4[(bo >> 2) + j] = exp(LOAD4((bi >> 2) + j) - m) * inv;
    return;
#endif
    for (uint j = first; j < end; j += step) {
        uint si, so;
        reduced_offsets(j, si, so);
        FSTORE(y, bo + so, exp(LOADX(bi + si) - m) * inv);
    }
}
