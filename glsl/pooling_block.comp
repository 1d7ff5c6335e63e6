#version 450
// DML_MAX_POOLING(1,2)_OPERATOR_DESC (without OutputIndicesTensor) and
// DML_AVERAGE_POOLING(1)_OPERATOR_DESC on float32, as glsl/pooling.comp computes them (its
// header states the rules), the way glsl/lp_pooling_block.comp reads LP pooling's input:
// an invocation computes 8 neighbouring outputs of the last dimension from whole row
// segments read as RGBA32F texels (a uniform texel buffer of unit last stride, bound per
// window of at most maxTexelBufferElements texels).  Each window row's T inputs (shared
// by the 8 overlapping windows) are fetched once as NT aligned texels (a quarter of the
// fetches of R32F texels) and folded into a column (max, or sum) over the window rows;
// each output then folds its WL columns.  The last dimension's window, stride, dilation
// and row shift are compile-time (a variant each), and max / average (PMAX) too:
// SwiftShader unrolls only compile-time loops, and a loop it does not unroll keeps its
// arrays in memory.  The outer window rows stay rolled loops.
//   max: padded cells never win (a window wholly in the padding gives -inf); a NaN
//        beats every number.
//   average: the float32 sum of the cells inside the input divided by `divisor` where it
//        is > 0 (IncludePadding: the window's element count) or by their count (0 when
//        there are none): rows inside times columns inside, the window being a box.
//
// vkml:variant pooling_block_max_w2s2d1h0 PMAX=1 BW=2u BS=2u BL=1u SH=0u
// vkml:variant pooling_block_max_w2s2d1h1 PMAX=1 BW=2u BS=2u BL=1u SH=1u
// vkml:variant pooling_block_max_w2s2d1h2 PMAX=1 BW=2u BS=2u BL=1u SH=2u
// vkml:variant pooling_block_max_w2s2d1h3 PMAX=1 BW=2u BS=2u BL=1u SH=3u
// vkml:variant pooling_block_max_w3s1d1h0 PMAX=1 BW=3u BS=1u BL=1u SH=0u
// vkml:variant pooling_block_max_w3s1d1h1 PMAX=1 BW=3u BS=1u BL=1u SH=1u
// vkml:variant pooling_block_max_w3s1d1h2 PMAX=1 BW=3u BS=1u BL=1u SH=2u
// vkml:variant pooling_block_max_w3s1d1h3 PMAX=1 BW=3u BS=1u BL=1u SH=3u
// vkml:variant pooling_block_max_w3s2d1h0 PMAX=1 BW=3u BS=2u BL=1u SH=0u
// vkml:variant pooling_block_max_w3s2d1h1 PMAX=1 BW=3u BS=2u BL=1u SH=1u
// vkml:variant pooling_block_max_w3s2d1h2 PMAX=1 BW=3u BS=2u BL=1u SH=2u
// vkml:variant pooling_block_max_w3s2d1h3 PMAX=1 BW=3u BS=2u BL=1u SH=3u
// vkml:variant pooling_block_max_w5s1d1h0 PMAX=1 BW=5u BS=1u BL=1u SH=0u
// vkml:variant pooling_block_max_w5s1d1h1 PMAX=1 BW=5u BS=1u BL=1u SH=1u
// vkml:variant pooling_block_max_w5s1d1h2 PMAX=1 BW=5u BS=1u BL=1u SH=2u
// vkml:variant pooling_block_max_w5s1d1h3 PMAX=1 BW=5u BS=1u BL=1u SH=3u
// vkml:variant pooling_block_avg_w2s2d1h0 PMAX=0 BW=2u BS=2u BL=1u SH=0u
// vkml:variant pooling_block_avg_w2s2d1h1 PMAX=0 BW=2u BS=2u BL=1u SH=1u
// vkml:variant pooling_block_avg_w2s2d1h2 PMAX=0 BW=2u BS=2u BL=1u SH=2u
// vkml:variant pooling_block_avg_w2s2d1h3 PMAX=0 BW=2u BS=2u BL=1u SH=3u
// vkml:variant pooling_block_avg_w3s1d1h0 PMAX=0 BW=3u BS=1u BL=1u SH=0u
// vkml:variant pooling_block_avg_w3s1d1h1 PMAX=0 BW=3u BS=1u BL=1u SH=1u
// vkml:variant pooling_block_avg_w3s1d1h2 PMAX=0 BW=3u BS=1u BL=1u SH=2u
// vkml:variant pooling_block_avg_w3s1d1h3 PMAX=0 BW=3u BS=1u BL=1u SH=3u
// vkml:variant pooling_block_avg_w3s2d1h0 PMAX=0 BW=3u BS=2u BL=1u SH=0u
// vkml:variant pooling_block_avg_w3s2d1h1 PMAX=0 BW=3u BS=2u BL=1u SH=1u
// vkml:variant pooling_block_avg_w3s2d1h2 PMAX=0 BW=3u BS=2u BL=1u SH=2u
// vkml:variant pooling_block_avg_w3s2d1h3 PMAX=0 BW=3u BS=2u BL=1u SH=3u
// vkml:variant pooling_block_avg_w5s1d1h0 PMAX=0 BW=5u BS=1u BL=1u SH=0u
// vkml:variant pooling_block_avg_w5s1d1h1 PMAX=0 BW=5u BS=1u BL=1u SH=1u
// vkml:variant pooling_block_avg_w5s1d1h2 PMAX=0 BW=5u BS=1u BL=1u SH=2u
// vkml:variant pooling_block_avg_w5s1d1h3 PMAX=0 BW=5u BS=1u BL=1u SH=3u
#extension GL_EXT_control_flow_attributes : require
layout(set = 0, binding = 0) uniform samplerBuffer Xt;      // RGBA32F: 4 elements a texel
layout(std430, set = 0, binding = 1) buffer Out { float y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 or 5: N, C, 2 or 3 spatial
layout(constant_id = 2) const int XDIMS = 1;     // always 1 here
#define VKML_WINDOW_DIMS 3
#include "vkml_window.glsl"
const uint PB_WL = BW, PB_SL = BS, PB_LL = BL;
// where a row segment's input 0 lies in its first texel, the same for every row and lane
// (the host checks 16-byte aligned rows and bindings): a per-lane shift made
// SwiftShader's pipeline compilation run for minutes (glsl/lp_pooling_block.comp)
const uint PB_SHIFT = SH;
const uint PB_V = 8u;                              // outputs per invocation
const uint PB_T = PB_SL * (PB_V - 1u) + PB_LL * (PB_WL - 1u) + 1u;   // inputs of a segment
const uint PB_NT = (PB_T + PB_SHIFT + 3u) / 4u;    // texels fetched per row
const bool PB_MAX = PMAX == 1;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: POOL_VSTORE selects the vec4 stores' code.
// vkml:frozen POOL_VSTORE
layout(constant_id = 28) const bool POOL_VSTORE = false;   // the 8 outputs as two vec4s

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension
    uvec4 in_size;                // spatial sizes
    ivec4 start;                  // StartPadding (after safe_geometry)
    float divisor;                // > 0: IncludePadding's window element count
};

#include "vkml_box.glsl"

const bool R5 = RANK == 5;
const int D = RANK - 2;
// the outer spatial dimensions as A (3-D only; 1 wide in 2-D) and B
const uint WA = R5 ? W0 : 1u, SA = R5 ? S0 : 1u, LA = R5 ? L0 : 1u;
const uint WB = R5 ? W1 : W0, SB = R5 ? S1 : S0, LB = R5 ? L1 : L0;
#define LOWEST uintBitsToFloat(0xFF800000u)

// max with NaN winning (either operand).  The operands of ?:, || and && below are plain
// variables or constants: glslang branches around a non-trivial one (a block each), and
// SwiftShader's pipeline compilation grows faster than linearly with the blocks.
float nan_max(float a, float b) {
    bool gt = a > b, nan = isnan(a);
    bool take = gt || nan;
    return take ? a : b;
}

float fold(float a, float b) {
    if (PB_MAX) return nan_max(a, b);       // compile-time
    return a + b;
}
#define IDENTITY (PB_MAX ? LOWEST : 0.0)

void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint gy = gl_GlobalInvocationID.y;
    if (!(gx < x_count && gy < AT(extent, RANK - 2))) return;
    // z: (N, C) in 2-D, (N, C, A) in 3-D
    uint z = gl_GlobalInvocationID.z;
    uint ca = 0u;
    if (R5) {
        uint q = divide(z, 2);
        ca = origin[0].z + z - q * extent[0].z;
        z = q;
    }
    uint q1 = divide(z, 1);
    uint cc = origin[0].y + z - q1 * extent[0].y;
    uint cn = origin[0].x + q1;
    uint cb = AT(origin, RANK - 2) + gy;
    uint cl = AT(origin, RANK - 1) + gx * PB_V;
    uint count = min(PB_V, AT(origin, RANK - 1) + AT(extent, RANK - 1) - cl);

    uint sA = R5 ? in_size.x : 1u, sB = in_size[D - 2], sL = in_size[D - 1];
    uint tA = R5 ? in_stride[0].z : 0u, tB = AT(in_stride, RANK - 2);
    int iA0 = R5 ? int(ca * SA) - start.x : 0;
    int iB0 = int(cb * SB) - start[D - 2];
    int iL0 = int(cl * PB_SL) - start[D - 1];
    int gbase = int(cn * in_stride[0].x + cc * in_stride[0].y - in_base) + iL0;
    int last_texel = textureSize(Xt) - 1;

    // the column folds of the segment, texel by texel (each fetched texel folded before
    // the next is fetched); rows outside the input fold nothing
    float col[PB_T];
    [[unroll]] for (uint t = 0u; t < PB_T; t++) col[t] = PB_MAX ? LOWEST : 0.0;
    float rows = 0.0;             // window rows inside the input (average's count)
    for (uint ka = 0u; ka < WA; ka++) {
        int ia = iA0 + int(ka * LA);
        bool oka = uint(ia) < sA;
        for (uint kb = 0u; kb < WB; kb++) {
            int ib = iB0 + int(kb * LB);
            bool okr = oka && uint(ib) < sB;
            rows += okr ? 1.0 : 0.0;
            int q0 = (gbase + ia * int(tA) + ib * int(tB)) >> 2;
            [[unroll]] for (uint i = 0u; i < PB_NT; i++) {
                vec4 tx = texelFetch(Xt, clamp(q0 + int(i), 0, last_texel));
                tx = okr ? tx : vec4(PB_MAX ? LOWEST : 0.0);
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    uint t = 4u * i + c - PB_SHIFT;     // below 0 wraps: not in the segment
                    if (t < PB_T) col[t] = fold(tx[c], col[t]);
                }
            }
        }
    }
    // columns outside the row (other rows' inputs, maybe inf or NaN) count nothing
    float inside[PB_T];
    [[unroll]] for (uint t = 0u; t < PB_T; t++) {
        bool ok = uint(iL0 + int(t)) < sL;
        inside[t] = ok ? 1.0 : 0.0;
        float c = col[t];
        col[t] = ok ? c : IDENTITY;
    }
    float r[PB_V];
    [[unroll]] for (uint j = 0u; j < PB_V; j++) {
        float s = PB_MAX ? LOWEST : 0.0, n = 0.0;
        [[unroll]] for (uint kl = 0u; kl < PB_WL; kl++) {
            uint t = j * PB_SL + kl * PB_LL;
            s = fold(col[t], s);
            n += inside[t];
        }
        n *= rows;
        bool by_window = divisor > 0.0;
        float by = by_window ? divisor : n;
        float q = s / by;
        bool none = by == 0.0;
        float avg = none ? 0.0 : q;
        r[j] = PB_MAX ? s : avg;
    }
    uint o = cn * out_stride[0].x + cc * out_stride[0].y + (R5 ? ca * out_stride[0].z : 0u)
             + cb * AT(out_stride, RANK - 2) + cl * AT(out_stride, RANK - 1) - out_base;
    uint ostep = AT(out_stride, RANK - 1);
    // the 8 outputs as two vec4s where they can be; the others (a row's short last
    // invocation, outputs not packed) in one rolled loop with one scalar store:
    // SwiftShader pays for each store in the code even where no lane runs it
    bool vec = POOL_VSTORE && count == PB_V;
    if (vec) {
        [[unroll]] for (uint j = 0u; j < PB_V / 4u; j++)
            y4[(o >> 2) + j] = vec4(r[4u * j], r[4u * j + 1u], r[4u * j + 2u], r[4u * j + 3u]);
    }
    for (uint j = 0u; j < (vec ? 0u : count); j++) {
        float v = r[0];
        [[unroll]] for (uint k = 1u; k < PB_V; k++) {
            float rk = r[k];
            bool pick = j == k;
            v = pick ? rk : v;
        }
        y[o + j * ostep] = v;
    }
}
