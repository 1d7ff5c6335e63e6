#version 450
// DML_MAX_POOLING(1,2)_OPERATOR_DESC (without OutputIndicesTensor) and
// DML_AVERAGE_POOLING(1)_OPERATOR_DESC on float32 in 2-D with a square window of unit
// dilation whose stride is at most its size, as glsl/pooling.comp computes them (its
// header states the rules): glsl/pooling_block.comp's reads (row segments of 8 outputs as
// RGBA32F texels, the 4 row shifts a variant each), but an invocation slides down `rows`
// output rows.  Each input row is fetched once and folded along the row (8 window
// maxima or sums); an output row folds the BW row folds of its window, of which the
// BW - BS shared with the row above stay in registers (`hist`), so a stride-1 3x3 window
// fetches each input row once, not three times, and a stride-2 3x3 one twice for three.
// Window, stride, row shift and max / average are compile-time (SwiftShader unrolls only
// compile-time loops; an array a rolled loop indexes lives in memory there), the row
// loop rolled.  U64 variants store the 8 outputs as one u64vec4 (POOL_VSTORE then means
// 8-aligned): lavapipe stores a vector one component at a time, so half the components
// carry the same bytes (glsl/include/vkml_u64.glsl).
//   max: padded cells never win (a window wholly in the padding gives -inf); a NaN
//        beats every number.
//   average: the float32 sum of the cells inside the input times 1 / `divisor` where it
//        is > 0 (IncludePadding: the window's element count), else times 1 / (rows
//        inside) and 1 / (columns inside), their count's reciprocal (0 when there are
//        none): within 2 ulp of the division, without one per output.
//
// vkml:variant pooling_slide_max_w2s2h0 PMAX=1 BW=2u BS=2u SH=0u
// vkml:variant pooling_slide_max_w2s2h1 PMAX=1 BW=2u BS=2u SH=1u
// vkml:variant pooling_slide_max_w2s2h2 PMAX=1 BW=2u BS=2u SH=2u
// vkml:variant pooling_slide_max_w2s2h3 PMAX=1 BW=2u BS=2u SH=3u
// vkml:variant pooling_slide_max_w3s1h0 PMAX=1 BW=3u BS=1u SH=0u
// vkml:variant pooling_slide_max_w3s1h1 PMAX=1 BW=3u BS=1u SH=1u
// vkml:variant pooling_slide_max_w3s1h2 PMAX=1 BW=3u BS=1u SH=2u
// vkml:variant pooling_slide_max_w3s1h3 PMAX=1 BW=3u BS=1u SH=3u
// vkml:variant pooling_slide_max_w3s2h0 PMAX=1 BW=3u BS=2u SH=0u
// vkml:variant pooling_slide_max_w3s2h1 PMAX=1 BW=3u BS=2u SH=1u
// vkml:variant pooling_slide_max_w3s2h2 PMAX=1 BW=3u BS=2u SH=2u
// vkml:variant pooling_slide_max_w3s2h3 PMAX=1 BW=3u BS=2u SH=3u
// vkml:variant pooling_slide_max_w5s1h0 PMAX=1 BW=5u BS=1u SH=0u
// vkml:variant pooling_slide_max_w5s1h1 PMAX=1 BW=5u BS=1u SH=1u
// vkml:variant pooling_slide_max_w5s1h2 PMAX=1 BW=5u BS=1u SH=2u
// vkml:variant pooling_slide_max_w5s1h3 PMAX=1 BW=5u BS=1u SH=3u
// vkml:variant pooling_slide_avg_w2s2h0 PMAX=0 BW=2u BS=2u SH=0u
// vkml:variant pooling_slide_avg_w2s2h1 PMAX=0 BW=2u BS=2u SH=1u
// vkml:variant pooling_slide_avg_w2s2h2 PMAX=0 BW=2u BS=2u SH=2u
// vkml:variant pooling_slide_avg_w2s2h3 PMAX=0 BW=2u BS=2u SH=3u
// vkml:variant pooling_slide_avg_w3s1h0 PMAX=0 BW=3u BS=1u SH=0u
// vkml:variant pooling_slide_avg_w3s1h1 PMAX=0 BW=3u BS=1u SH=1u
// vkml:variant pooling_slide_avg_w3s1h2 PMAX=0 BW=3u BS=1u SH=2u
// vkml:variant pooling_slide_avg_w3s1h3 PMAX=0 BW=3u BS=1u SH=3u
// vkml:variant pooling_slide_avg_w3s2h0 PMAX=0 BW=3u BS=2u SH=0u
// vkml:variant pooling_slide_avg_w3s2h1 PMAX=0 BW=3u BS=2u SH=1u
// vkml:variant pooling_slide_avg_w3s2h2 PMAX=0 BW=3u BS=2u SH=2u
// vkml:variant pooling_slide_avg_w3s2h3 PMAX=0 BW=3u BS=2u SH=3u
// vkml:variant pooling_slide_avg_w5s1h0 PMAX=0 BW=5u BS=1u SH=0u
// vkml:variant pooling_slide_avg_w5s1h1 PMAX=0 BW=5u BS=1u SH=1u
// vkml:variant pooling_slide_avg_w5s1h2 PMAX=0 BW=5u BS=1u SH=2u
// vkml:variant pooling_slide_avg_w5s1h3 PMAX=0 BW=5u BS=1u SH=3u
// vkml:variant pooling_slide_max_w2s2h0_u64 PMAX=1 BW=2u BS=2u SH=0u U64=1
// vkml:variant pooling_slide_max_w2s2h1_u64 PMAX=1 BW=2u BS=2u SH=1u U64=1
// vkml:variant pooling_slide_max_w2s2h2_u64 PMAX=1 BW=2u BS=2u SH=2u U64=1
// vkml:variant pooling_slide_max_w2s2h3_u64 PMAX=1 BW=2u BS=2u SH=3u U64=1
// vkml:variant pooling_slide_max_w3s1h0_u64 PMAX=1 BW=3u BS=1u SH=0u U64=1
// vkml:variant pooling_slide_max_w3s1h1_u64 PMAX=1 BW=3u BS=1u SH=1u U64=1
// vkml:variant pooling_slide_max_w3s1h2_u64 PMAX=1 BW=3u BS=1u SH=2u U64=1
// vkml:variant pooling_slide_max_w3s1h3_u64 PMAX=1 BW=3u BS=1u SH=3u U64=1
// vkml:variant pooling_slide_max_w3s2h0_u64 PMAX=1 BW=3u BS=2u SH=0u U64=1
// vkml:variant pooling_slide_max_w3s2h1_u64 PMAX=1 BW=3u BS=2u SH=1u U64=1
// vkml:variant pooling_slide_max_w3s2h2_u64 PMAX=1 BW=3u BS=2u SH=2u U64=1
// vkml:variant pooling_slide_max_w3s2h3_u64 PMAX=1 BW=3u BS=2u SH=3u U64=1
// vkml:variant pooling_slide_max_w5s1h0_u64 PMAX=1 BW=5u BS=1u SH=0u U64=1
// vkml:variant pooling_slide_max_w5s1h1_u64 PMAX=1 BW=5u BS=1u SH=1u U64=1
// vkml:variant pooling_slide_max_w5s1h2_u64 PMAX=1 BW=5u BS=1u SH=2u U64=1
// vkml:variant pooling_slide_max_w5s1h3_u64 PMAX=1 BW=5u BS=1u SH=3u U64=1
// vkml:variant pooling_slide_avg_w2s2h0_u64 PMAX=0 BW=2u BS=2u SH=0u U64=1
// vkml:variant pooling_slide_avg_w2s2h1_u64 PMAX=0 BW=2u BS=2u SH=1u U64=1
// vkml:variant pooling_slide_avg_w2s2h2_u64 PMAX=0 BW=2u BS=2u SH=2u U64=1
// vkml:variant pooling_slide_avg_w2s2h3_u64 PMAX=0 BW=2u BS=2u SH=3u U64=1
// vkml:variant pooling_slide_avg_w3s1h0_u64 PMAX=0 BW=3u BS=1u SH=0u U64=1
// vkml:variant pooling_slide_avg_w3s1h1_u64 PMAX=0 BW=3u BS=1u SH=1u U64=1
// vkml:variant pooling_slide_avg_w3s1h2_u64 PMAX=0 BW=3u BS=1u SH=2u U64=1
// vkml:variant pooling_slide_avg_w3s1h3_u64 PMAX=0 BW=3u BS=1u SH=3u U64=1
// vkml:variant pooling_slide_avg_w3s2h0_u64 PMAX=0 BW=3u BS=2u SH=0u U64=1
// vkml:variant pooling_slide_avg_w3s2h1_u64 PMAX=0 BW=3u BS=2u SH=1u U64=1
// vkml:variant pooling_slide_avg_w3s2h2_u64 PMAX=0 BW=3u BS=2u SH=2u U64=1
// vkml:variant pooling_slide_avg_w3s2h3_u64 PMAX=0 BW=3u BS=2u SH=3u U64=1
// vkml:variant pooling_slide_avg_w5s1h0_u64 PMAX=0 BW=5u BS=1u SH=0u U64=1
// vkml:variant pooling_slide_avg_w5s1h1_u64 PMAX=0 BW=5u BS=1u SH=1u U64=1
// vkml:variant pooling_slide_avg_w5s1h2_u64 PMAX=0 BW=5u BS=1u SH=2u U64=1
// vkml:variant pooling_slide_avg_w5s1h3_u64 PMAX=0 BW=5u BS=1u SH=3u U64=1
#extension GL_EXT_control_flow_attributes : require
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
layout(set = 0, binding = 0) uniform samplerBuffer Xt;      // RGBA32F: 4 elements a texel
layout(std430, set = 0, binding = 1) buffer Out { float y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#ifdef U64
layout(std430, set = 0, binding = 1) buffer Out8 { u64vec4 y8[]; };
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // always 4 here: N, C, H, W
layout(constant_id = 2) const int XDIMS = 1;     // always 1 here
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: POOL_VSTORE selects the vec4 stores' code.
// vkml:frozen POOL_VSTORE POOL_FLAT
layout(constant_id = 28) const bool POOL_VSTORE = false;   // the 8 outputs as two vec4s (U64: one u64vec4)
// x runs over (plane, row segment) flattened, the grid's z being 1: a workgroup's lanes
// span planes, so none idles where a row's segments do not fill a SIMD vector (a 56-wide
// row has 7 segments: CPU drivers run 8 lanes at a time)
layout(constant_id = 29) const bool POOL_FLAT = false;

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension
    uvec4 in_size;                // spatial sizes
    ivec4 start;                  // StartPadding (after safe_geometry)
    float divisor;                // > 0: IncludePadding's window element count
    uint rows;                    // output rows an invocation computes (grid y counts them)
};

#include "vkml_box.glsl"

const uint PB_V = 8u;                              // outputs per invocation and row
// where a row segment's input 0 lies in its first texel, the same for every row and lane
// (the host checks 16-byte aligned rows and bindings)
const uint PB_SHIFT = SH;
const uint PB_T = BS * (PB_V - 1u) + BW;           // inputs of a row segment
const uint PB_NT = (PB_T + PB_SHIFT + 3u) / 4u;    // texels fetched per row
const uint PB_H = BW - BS;                         // row folds an output row hands down
const uint PB_HA = PB_H > 0u ? PB_H : 1u;          // (an array of at least one)
const bool PB_MAX = PMAX == 1;
#define LOWEST uintBitsToFloat(0xFF800000u)
#define IDENTITY (PB_MAX ? LOWEST : 0.0)

// max with NaN winning (either operand).  The operands of ?:, || and && are plain
// variables throughout: glslang branches around a non-trivial one (a block each), and
// SwiftShader's pipeline compilation grows faster than linearly with the blocks.
float nan_max(float a, float b) {
    bool gt = a > b, nan = isnan(a);
    bool take = gt || nan;
    return take ? a : b;
}

float fold(float a, float b) {
    return PB_MAX ? nan_max(a, b) : a + b;
}

int q_base;                       // the texel index of input row 0's segment, times 4
int last_texel;
uint size_b;
int stride_b;
// The PB_V window folds along input row ib of the segment (identity where the row lies
// in the padding): its texels fetched once, columns outside the row folding nothing.
// (`col_in`: the segment's inputs inside the row)
void row_fold(int ib, bool col_in[PB_T], out float h[PB_V]) {
    bool okr = uint(ib) < size_b;
    int q0 = (q_base + ib * stride_b) >> 2;
    float seg[PB_T];
    [[unroll]] for (uint i = 0u; i < PB_NT; i++) {
        vec4 tx = texelFetch(Xt, clamp(q0 + int(i), 0, last_texel));
        [[unroll]] for (uint c = 0u; c < 4u; c++) {
            uint t = 4u * i + c - PB_SHIFT;      // below 0 wraps: not in the segment
            if (t < PB_T) {
                bool inside = col_in[t];
                bool ok = okr && inside;
                float v = tx[c];
                seg[t] = ok ? v : IDENTITY;
            }
        }
    }
    [[unroll]] for (uint j = 0u; j < PB_V; j++) {
        float s = seg[j * BS];
        [[unroll]] for (uint k = 1u; k < BW; k++) s = fold(s, seg[j * BS + k]);
        h[j] = s;
    }
}

void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint gy = gl_GlobalInvocationID.y;
    uint z = gl_GlobalInvocationID.z;
    if (POOL_FLAT) {              // one division an invocation, not a row
        z = gx / x_count;
        gx -= z * x_count;
    }
    uint first = gy * rows;       // this invocation's first output row in the box
    uint planes = extent[0].x * extent[0].y;
    bool in_x = gx < x_count, in_y = first < extent[0].z, in_z = z < planes;
    if (!(in_x && in_y && in_z)) return;
    uint q1 = divide(z, 1);
    uint cc = origin[0].y + z - q1 * extent[0].y;
    uint cn = origin[0].x + q1;
    uint cb = origin[0].z + first;
    uint nrows = min(rows, extent[0].z - first);
    uint cl = origin[0].w + gx * PB_V;
    uint count = min(PB_V, origin[0].w + extent[0].w - cl);

    size_b = in_size.x;
    stride_b = int(in_stride[0].z);
    int iB0 = int(cb * BS) - start.x;
    int iL0 = int(cl * BS) - start.y;
    q_base = int(cn * in_stride[0].x + cc * in_stride[0].y - in_base) + iL0;
    last_texel = textureSize(Xt) - 1;
    bool col_in[PB_T];
    [[unroll]] for (uint t = 0u; t < PB_T; t++) col_in[t] = uint(iL0 + int(t)) < in_size.y;
    // average: each output's scale, row-independent: 1 / divisor (IncludePadding), else
    // 1 / (its window columns inside the row), which the row loop multiplies by 1 / (the
    // window rows inside): two multiplies an output rather than a division (0 where no
    // cell is inside: the sum of none is 0)
    bool by_window = divisor > 0.0;
    float cf[PB_V];
    [[unroll]] for (uint j = 0u; j < PB_V; j++) {
        float cols = 0.0;
        [[unroll]] for (uint k = 0u; k < BW; k++) {
            bool inside = col_in[j * BS + k];
            cols += inside ? 1.0 : 0.0;
        }
        float rc = 1.0 / cols, rd = 1.0 / divisor, zero = 0.0;
        bool some = cols > 0.0;
        float c = some ? rc : zero;
        cf[j] = by_window ? rd : c;
    }

    // the row folds of the first output row's window rows that the loop does not fetch
    float hist[PB_HA][PB_V];
    [[unroll]] for (uint r = 0u; r < PB_H; r++) row_fold(iB0 + int(r), col_in, hist[r]);

    uint o = cn * out_stride[0].x + cc * out_stride[0].y + cb * out_stride[0].z
             + cl * out_stride[0].w - out_base;
    uint ostep = out_stride[0].w;
    bool vec = POOL_VSTORE && count == PB_V;
    for (uint k = 0u; k < nrows; k++) {
        int ib = iB0 + int(k * BS);               // the output row's first window row
        float fresh[BS][PB_V];
        [[unroll]] for (uint r = 0u; r < BS; r++) row_fold(ib + int(PB_H + r), col_in, fresh[r]);
        float res[PB_V];
        [[unroll]] for (uint j = 0u; j < PB_V; j++) {
            float s = fresh[0][j];
            [[unroll]] for (uint r = 1u; r < BS; r++) s = fold(s, fresh[r][j]);
            [[unroll]] for (uint r = 0u; r < PB_H; r++) s = fold(hist[r][j], s);
            res[j] = s;
        }
        if (!PB_MAX) {
            // the window rows inside the input
            int nr = clamp(min(ib + int(BW), int(size_b)) - max(ib, 0), 0, int(BW));
            float rr = 1.0 / float(nr), zero = 0.0, one = 1.0;
            bool some = nr > 0;
            float rf = some ? rr : zero;
            rf = by_window ? one : rf;
            [[unroll]] for (uint j = 0u; j < PB_V; j++) res[j] *= cf[j] * rf;
        }
        // the last PB_H window rows are the next output row's first
        [[unroll]] for (uint r = 0u; r < PB_H; r++) {
            [[unroll]] for (uint j = 0u; j < PB_V; j++) {
                if (r + BS < PB_H) hist[r][j] = hist[r + BS][j];       // compile-time
                else hist[r][j] = fresh[r + BS - PB_H][j];
            }
        }
        // the 8 outputs as two vec4s where they can be; the others (a row's short last
        // invocation, outputs not packed) in one rolled loop with one scalar store:
        // SwiftShader pays for each store in the code even where no lane runs it
        if (vec) {
#ifdef U64
            y8[o >> 3] = vkml_u64x4(floatBitsToUint(vec4(res[0], res[1], res[2], res[3])),
                                    floatBitsToUint(vec4(res[4], res[5], res[6], res[7])));
#else
            [[unroll]] for (uint j = 0u; j < PB_V / 4u; j++)
                y4[(o >> 2) + j] = vec4(res[4u * j], res[4u * j + 1u], res[4u * j + 2u],
                                        res[4u * j + 3u]);
#endif
        }
        for (uint j = 0u; j < (vec ? 0u : count); j++) {
            float v = res[0];
            [[unroll]] for (uint i = 1u; i < PB_V; i++) {
                float ri = res[i];
                bool pick = j == i;
                v = pick ? ri : v;
            }
            y[o + j * ostep] = v;
        }
        o += out_stride[0].z;
    }
}
