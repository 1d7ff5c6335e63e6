#version 450
// Convolution as an implicit GEMM, register-blocked: each invocation computes MB output
// channels x NB consecutive output pixels of one row, summing over (input channel, tap)
// pairs.  No im2col buffer: the B operand is read straight from float32 input planes
// (the padded copy made by convolution_relayout.comp, or the input itself when it needs
// no padding), at
//     X[image][channel][pixel(q) + tap_offset]       pixel(q) = qd*xs.z + qh*xs.w + qw*SW
// and the A operand from filters re-laid as [group][row tap][channel][column tap][output
// channel].  Row taps (kernel positions along d and h) are offsets in a uniform table;
// column taps (along w) are unrolled (KW, DW): with unit pixel step one row of X is
// loaded once per (row tap, channel) and reused by every column tap.
//
// One kernel serves every fast dense path (ops/convolution/):
// * forward convolution (any stride, dilation, padding; groups with enough channels):
//   taps = the kernel window's offsets in the padded plane;
// * 1x1 convolution as a plain GEMM: one tap, the plane as one row;
// * transposed convolution without zero insertion: one dispatch per stride phase, the
//   taps that reach that phase, output pixels stepping by the stride (YSTEP);
// * Winograd's batched GEMM: image = transform point, raw float32 store (SGW: the
//   filter of each image at w_sg_apart.y elements from the previous one's).
// The epilogue adds the bias, applies the fused activation and stores through the
// output's DML strides (float32 / float16 / packed float16).
//
// Operands come through uniform texel buffers where the device can bind them (lavapipe
// vectorizes texel fetches but runs storage-buffer loads one lane at a time), else
// through storage buffers.
//
// vkml:variant convolution_gemm_f32 F32=1 TEXEL=1
// vkml:variant convolution_gemm_f16 F16=1 TEXEL=1
// vkml:variant convolution_gemm_f16_packed F16_PACKED=1 TEXEL=1
// vkml:variant convolution_gemm_f32_ssbo F32=1
// vkml:variant convolution_gemm_f16_ssbo F16=1
// vkml:variant convolution_gemm_f16_packed_ssbo F16_PACKED=1
// vkml:variant convolution_gemm_sg_f32 F32=1 TEXEL=1 SGW=1
// vkml:variant convolution_gemm_f32_v8 F32=1 TEXEL=1 V8=1
// vkml:variant convolution_gemm_sg_f32_v8 F32=1 TEXEL=1 SGW=1 V8=1
// vkml:variant convolution_gemm_sg_f16 F16=1 TEXEL=1 SGW=1
// vkml:variant convolution_gemm_sg_f16_packed F16_PACKED=1 TEXEL=1 SGW=1
// vkml:variant convolution_gemm_f32_res F32=1 TEXEL=1 RES=1
// vkml:variant convolution_gemm_f16_res F16=1 TEXEL=1 RES=1
// vkml:variant convolution_gemm_f16_packed_res F16_PACKED=1 TEXEL=1 RES=1
// vkml:variant convolution_gemm_f32_ssbo_res F32=1 RES=1
// vkml:variant convolution_gemm_f16_ssbo_res F16=1 RES=1
// vkml:variant convolution_gemm_f16_packed_ssbo_res F16_PACKED=1 RES=1
// vkml:variant convolution_gemm_sg_f32_res F32=1 TEXEL=1 SGW=1 RES=1
// vkml:variant convolution_gemm_f32_v8_res F32=1 TEXEL=1 V8=1 RES=1
// vkml:variant convolution_gemm_sg_f32_v8_res F32=1 TEXEL=1 SGW=1 V8=1 RES=1
// vkml:variant convolution_gemm_sg_f16_res F16=1 TEXEL=1 SGW=1 RES=1
// vkml:variant convolution_gemm_sg_f16_packed_res F16_PACKED=1 TEXEL=1 SGW=1 RES=1
// vkml:variant convolution_gemm_f32_sc F32=1 TEXEL=1 SC=1
// vkml:variant convolution_gemm_f32_res_sc F32=1 TEXEL=1 RES=1 SC=1
// vkml:variant convolution_gemm_f32_v8_sc F32=1 TEXEL=1 V8=1 SC=1
// vkml:variant convolution_gemm_f32_v8_res_sc F32=1 TEXEL=1 V8=1 RES=1 SC=1
// vkml:variant convolution_gemm_sg_f32_sc F32=1 TEXEL=1 SGW=1 SC=1
// vkml:variant convolution_gemm_sg_f32_res_sc F32=1 TEXEL=1 SGW=1 RES=1 SC=1
// vkml:variant convolution_gemm_sg_f32_v8_sc F32=1 TEXEL=1 SGW=1 V8=1 SC=1
// vkml:variant convolution_gemm_sg_f32_v8_res_sc F32=1 TEXEL=1 SGW=1 V8=1 RES=1 SC=1
//
// RES variants (a graph's residual fusion, vkml/ops/graph.py) add a residual tensor R,
// laid out as the output (same type and element strides), after the bias and before the
// activation: y = act(conv + bias + R).  A variant of its own rather than a
// specialization constant: SwiftShader keeps a constant-dead branch in the code.
//
// SC variants (a graph's input-scale fusion: a squeeze-excitation block's Mul by a
// per-(image, channel) scale S before the convolution) multiply each B element by its
// channel's scale as it is loaded: conv(x * s) with the products x * s rounded as the
// Mul would store them, without writing x * s.  Only on planes read in place (1x1
// convolutions), where there is no padding that a scale could turn from 0 into NaN.
//
// SGW variants read the filter in place through its DML strides (no re-laid copy) and
// share it across a subgroup: the lanes of a subgroup work on the same output channels
// (different pixel blocks), each lane fetches a few of the block's MB x KW weights of a
// (channel, row tap) and the others get them by subgroup shuffles at constant lanes.
// On lavapipe a texel fetch costs the same whether its address is uniform or not, so
// this turns MB/4 RGBA fetches per tap per lane into MB*KW/SG R32F ones per row tap.
#extension GL_EXT_control_flow_attributes : require
#ifdef V8
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
#ifdef SGW
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int MB = 8;      // output channels per invocation (x4)
layout(constant_id = 2) const int NB = 8;      // output pixels per invocation
layout(constant_id = 3) const int SW = 1;      // X elements between consecutive pixels
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case; ACC_RUN picks the accumulation order
// and W4 the weights' fetch, so only one order's and one fetch's code is compiled.
// KS splits the reduction (below) and sizes nothing, but its division and modulo of the
// workgroup's z would otherwise run in every kernel that does not split (KS = 1).
// vkml:frozen ACT ACC_RUN W4 KS XSKEW GPOOL
layout(constant_id = 4) const int ACT = 0;     // ACT_* (vkml_activation.glsl)
layout(constant_id = 5) const bool XVEC4 = false; // read B rows as float4 (X bound RGBA32F;
                                               // SW == 1, NB and every row offset x4)
layout(constant_id = 6) const int KW = 1;      // column taps (innermost kernel axis)
layout(constant_id = 7) const int DW = 1;      // X elements between column taps
layout(constant_id = 8) const int SG = 8;      // SGW: subgroup size
layout(constant_id = 9) const int CU = 1;      // input channels per loop iteration (divides them)
layout(constant_id = 11) const bool YV4 = false; // F32: pixels stored 4 at a time
// KS > 1 (split-K, ops/convolution/gemm.py): the input channels split into KS slices of
// whole CU groups, workgroup z = image * KS + slice; each slice stores its partial sums
// (raw: the host sets ACT 0 and no bias, and binds Y to float32 partials laid out as
// [image][slice][channel][pixel], ys.x the image's stride over all its slices) and a
// second pass (convolution_partials.comp) adds the slices and applies the output pass.
// Wide devices run the few workgroups of a small plane's GEMM in parallel this way,
// each walking 1/KS of the reduction.
layout(constant_id = 14) const int KS = 1;
// XSKEW (SGW, ACC_RUN, XVEC4 on a flattened plane of no whole float4s: 7x7's 49 pixels):
// the channel stride mod 4.  A loop iteration's first channel starts on a texel (the
// host's rule: the plane's images and the iteration's CU channels whole texels), so its
// channel u starts (u * XSKEW) mod 4 elements past one, a constant of the unrolled body:
// the row loads from that texel on and drops the elements before the channel's.
layout(constant_id = 15) const int XSKEW = 0;
layout(constant_id = 10) const int CBW = 0;    // SGW: > 0: channel blocks per workgroup, one
                                               // per subgroup (local size CBW * SG)
#ifdef SGW
layout(constant_id = 12) const bool ACC_RUN = true; // an accumulator's products of a loop
                                               // iteration in a row (GEMM_RUN), else GEMM_STEP's
                                               // order
layout(constant_id = 13) const bool W4 = false; // ACC_RUN, KW == 1, CU a multiple of 4: the
                                               // filter bound RGBA32F, a lane's weights of 4
                                               // consecutive input channels one fetch
// GPOOL > 0: the output's global average pool (its GPOOL pixels an image) is stored
// instead of the output, Y bound to the pooled tensor (image and channel strides in
// ys_w.y, ys_w.z).  The host's rule: a subgroup's lanes hold every pixel block of an
// image, so the pool is a sum within each lane and across the subgroup.
layout(constant_id = 16) const int GPOOL = 0;
#endif

// X elements one row tap reads for the block.  Where that is no more than the products'
// operands (KW * NB) the row is loaded once and reused by every column tap (ROWLOAD);
// else (1xK strided kernels) each column tap loads its NB pixels.  Rounded up to whole
// float4 for XVEC4.
const int SPAN = (NB - 1) * SW + (KW - 1) * DW + 1;
const int SPAN4 = (SPAN + 3) / 4 * 4;
const bool ROWLOAD = SPAN <= KW * NB;

#ifdef TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer X;      // R32F (RGBA32F with XVEC4)
layout(set = 0, binding = 1) uniform samplerBuffer Wt;     // RGBA32F (SGW: R32F/R16F)
#define LOAD_X(i) texelFetch(X, i).x
#define LOAD_X4(i) texelFetch(X, i)
#define LOAD_W(i) texelFetch(Wt, i)
#define LOAD_W1(i) texelFetch(Wt, i).x
#else
layout(std430, set = 0, binding = 0) readonly buffer Xs { float xs_[]; };
layout(std430, set = 0, binding = 1) readonly buffer Ws { vec4 ws_[]; };
#define LOAD_X(i) xs_[i]
#define LOAD_X4(i) vec4(xs_[(i) * 4], xs_[(i) * 4 + 1], xs_[(i) * 4 + 2], xs_[(i) * 4 + 3])
#define LOAD_W(i) ws_[i]
#endif
layout(std430, set = 0, binding = 2) readonly buffer Bias { FSTORE_T bias[]; };
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
// YV4: four pixels of a channel as one store, a float4 or float16's four halves as a
// uvec2 (lavapipe stores a vector in one lane turn, a scalar in one turn each; packed
// float16 stores of single halves are atomics)
#ifdef F32
layout(std430, set = 0, binding = 3) buffer Y4 { vec4 y4[]; };
#ifdef V8
// V8 (int64 shaders) with YV4: eight pixels as one u64vec4 (lavapipe's store turn costs
// per component: 64-bit components carry twice the bytes); output rows in whole groups
// of 8; NB = 8a + 4 blocks start 8-aligned (a u64vec4s, then a u64vec2) or 4 past
// (the u64vec2 first), the pixels picked by selects on that parity
layout(std430, set = 0, binding = 3) buffer Y8 { u64vec4 y8[]; };
layout(std430, set = 0, binding = 3) buffer Y8h { u64vec2 y8h[]; };
#endif
#else
layout(std430, set = 0, binding = 3) buffer Y2 { uvec2 y2[]; };
#endif
#ifdef SC
#ifdef RES
#define SC_BINDING 6        // (bindings are numbered without gaps: after R where there is one)
#else
#define SC_BINDING 5
#endif
layout(set = 0, binding = SC_BINDING) uniform samplerBuffer S;  // R32F: per (image, channel)
#define SC_LOAD(s, u) float s = texelFetch(S, so + (u) * sc_c).x;
#define XSC(v, s) ((v) * (s))
#define SC_NEXT(k) so += (k) * sc_c;
#define SC_START() int so = n * sc_n + (g * cig + c0) * sc_c;  // the slice's first channel
#else
#define SC_START()
#define SC_LOAD(s, u)
#define XSC(v, s) (v)
#define SC_NEXT(k)
#endif
#ifdef RES
layout(std430, set = 0, binding = 5) readonly buffer Res { FSTORE_T res[]; };
#ifdef F32
layout(std430, set = 0, binding = 5) readonly buffer Res4 { vec4 res4[]; };
#ifdef V8
// (V8's groups of eight outputs read their residual as one u64vec4: a load, like a
// store, takes a turn a lane and a scalar load a component within it)
layout(std430, set = 0, binding = 5) readonly buffer Res8 { u64vec4 res8[]; };
#endif
#endif
#define RESID(i) FLOAD(res, (i))
#define PLUS_RESID(i) + FLOAD(res, (i))
#else
#define PLUS_RESID(i)       // (nothing: x + 0.0 is no identity, -0 + 0 = +0)
#endif
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 chans;        // input channels per group, padded output channels per group
                        // (multiple of MB), output channels per group, weight texels per image
    ivec4 xs;           // X element strides: image, channel, qd, qh
    ivec4 ysz;          // output D, H, W (positions that exist), has bias
    ivec4 ystep;        // output positions per q step in d, h, w; bias stride
    uvec4 ys;           // Y element strides: image, channel, d, h
    uvec4 ys_w;         // Y element stride w; GPOOL: pooled image and channel strides, -
    vec4 act;           // activation parameters
    ivec4 rows[256];    // row-tap offsets in X elements (kernel (d, h) positions), 4 per ivec4
#ifdef SGW
    ivec4 w_sg;         // filter element strides: output channel (within the group),
                        // input channel, column tap (signed: flipped); element of tap 0
    ivec4 w_sg_apart;   // filter elements between groups, between images (Winograd's
                        // 36 GEMMs: one filter per transform point; else 0), -, -
    ivec4 wrows[256];   // row-tap offsets in filter elements, as rows
#endif
};
layout(push_constant) uniform Push {
    ivec4 qsize;        // q extents of this dispatch: QD, QH, QW, blocks per row
    ivec4 yorg;         // output position of q = 0 (d, h, w); first row tap of this dispatch
    int nrows;          // row taps of this dispatch
    int w_base;         // first weight texel of this dispatch
    int x_base;         // X element index of the first element bound (batch windows)
    int y_base;         // Y element index of the first element bound
    int n0;             // first image of this dispatch
    int pitch;          // > 0: the q row is a whole plane flattened, pitch q per output row
    int cbl;            // channel blocks spread over the lanes (few pixels: lanes stay busy)
    int cb_count;       // channel blocks in all (groups * padded channels / MB)
#ifdef SC
    int sc_n;           // S element strides: image, channel
    int sc_c;
#endif
};

#ifdef SGW
// a[i] = weights of channels 4i..4i+3 at column tap kw: slot (4i + c) * KW + kw, held by
// lane slot % SG in wl[slot / SG]
#define LOAD_A(a, kw) [[unroll]] for (int i_ = 0; i_ < MB / 4; i_++) \
    [[unroll]] for (int c_ = 0; c_ < 4; c_++) { \
        int e_ = (i_ * 4 + c_) * KW + (kw); \
        a[i_][c_] = subgroupShuffle(wl[e_ / SG], uint(e_ % SG)); }
#else
#define LOAD_A(a, kw) [[unroll]] for (int i_ = 0; i_ < MB / 4; i_++) \
    a[i_] = LOAD_W(wi + (kw) * wstep + i_)
#endif

#ifdef SGW
// SGW, ACC_RUN: the CU input channels of one loop iteration of one row tap as one group:
// load their rows (or column taps' pixels) and weights, then add each accumulator's
// CU x KW products in a row before the next accumulator (the order of GEMM's sg family,
// gemm.comp SGA).  lavapipe keeps the block in memory: one load and store of an
// accumulator per CU x KW FMAs, where GEMM_STEP's order (one channel and column tap at a
// time over the whole block) takes one per FMA; that order still wins on some blocks
// (a tuner candidate, gemm_sg-step).  Each accumulator sums its products in the same
// (channel, column tap) order either way, so both give the same bits.
const int BL = ROWLOAD ? SPAN4 : KW * NB;            // X elements a channel holds
#define B_AT(u, kw, j) b[u][ROWLOAD ? (kw) * DW + (j) * SW : (kw) * NB + (j)]
#define GEMM_RUN() { \
    float wl[CU][GW]; \
    if (W4) { \
        [[unroll]] for (int u4 = 0; u4 < CU; u4 += 4) \
            [[unroll]] for (int k_ = 0; k_ < GW; k_++) { \
                vec4 q_ = LOAD_W(((wo + woff[k_]) >> 2) + u4 / 4); \
                wl[u4][k_] = q_.x; wl[min(u4 + 1, CU - 1)][k_] = q_.y; \
                wl[min(u4 + 2, CU - 1)][k_] = q_.z; wl[min(u4 + 3, CU - 1)][k_] = q_.w; } \
    } else { \
        [[unroll]] for (int u = 0; u < CU; u++) \
            [[unroll]] for (int k_ = 0; k_ < GW; k_++) wl[u][k_] = LOAD_W1(wo + u * w_sg.y + woff[k_]); \
    } \
    float b[CU][BL]; \
    [[unroll]] for (int u = 0; u < CU; u++) { \
        int xu = xo + u * xs.y; \
        SC_LOAD(su, u) \
        if (ROWLOAD && XVEC4) { \
            int sk = (u * XSKEW) & 3; \
            [[unroll]] for (int e = 0; e < SPAN4 + 4; e += 4) { \
                if (e < sk + SPAN) { \
                    vec4 v = XSC(LOAD_X4((xu - sk + e) >> 2), su); \
                    [[unroll]] for (int q_ = 0; q_ < 4; q_++) \
                        if (e + q_ >= sk && e + q_ - sk < SPAN4) b[u][e + q_ - sk] = v[q_]; \
                } \
            } \
        } else if (ROWLOAD) { \
            [[unroll]] for (int e = 0; e < SPAN; e++) b[u][e] = XSC(LOAD_X(xu + e), su); \
        } else { \
            [[unroll]] for (int kw = 0; kw < KW; kw++) \
                [[unroll]] for (int j = 0; j < NB; j++) \
                    b[u][kw * NB + j] = XSC(LOAD_X(xu + kw * DW + j * SW), su); \
        } \
    } \
    [[unroll]] for (int i = 0; i < MB / 4; i++) { \
        vec4 a[CU][KW]; \
        [[unroll]] for (int u = 0; u < CU; u++) \
            [[unroll]] for (int kw = 0; kw < KW; kw++) \
                [[unroll]] for (int c_ = 0; c_ < 4; c_++) { \
                    int e_ = (i * 4 + c_) * KW + kw; \
                    a[u][kw][c_] = subgroupShuffle(wl[u][e_ / SG], uint(e_ % SG)); } \
        [[unroll]] for (int j = 0; j < NB; j++) { \
            vec4 s = acc[i][j]; \
            [[unroll]] for (int u = 0; u < CU; u++) \
                [[unroll]] for (int kw = 0; kw < KW; kw++) \
                    s = fma(a[u][kw], vec4(B_AT(u, kw, j)), s); \
            acc[i][j] = s; \
        } \
    } \
    xo += CU * xs.y; wo += CU * w_sg.y; SC_NEXT(CU) }
#endif
// One input channel of one row tap: load the row (or the column taps' pixels), the
// weights, and add the MB x NB products; then step to the next channel.
#ifdef SGW
#define STEP_W() float wl[GW]; \
    [[unroll]] for (int k_ = 0; k_ < GW; k_++) wl[k_] = LOAD_W1(wo + woff[k_]);
#define STEP_NEXT() xo += xs.y; wo += w_sg.y; SC_NEXT(1)
#else
#define STEP_W()
#define STEP_NEXT() xo += xs.y; wi += KW * wstep; SC_NEXT(1)
#endif
#define GEMM_STEP() { \
    STEP_W() \
    SC_LOAD(s1, 0) \
    if (ROWLOAD) { \
        float b[SPAN4]; \
        if (XVEC4) { \
            [[unroll]] for (int e = 0; e < SPAN4; e += 4) { \
                vec4 v = XSC(LOAD_X4((xo + e) >> 2), s1); \
                b[e] = v.x; b[e + 1] = v.y; b[e + 2] = v.z; b[e + 3] = v.w; \
            } \
        } else { \
            [[unroll]] for (int e = 0; e < SPAN; e++) b[e] = XSC(LOAD_X(xo + e), s1); \
        } \
        [[unroll]] for (int kw = 0; kw < KW; kw++) { \
            vec4 a[MB / 4]; \
            LOAD_A(a, kw); \
            [[unroll]] for (int i = 0; i < MB / 4; i++) \
                [[unroll]] for (int j = 0; j < NB; j++) \
                    acc[i][j] = fma(a[i], vec4(b[kw * DW + j * SW]), acc[i][j]); \
        } \
    } else { \
        [[unroll]] for (int kw = 0; kw < KW; kw++) { \
            float b[NB]; \
            [[unroll]] for (int j = 0; j < NB; j++) \
                b[j] = XSC(LOAD_X(xo + kw * DW + j * SW), s1); \
            vec4 a[MB / 4]; \
            LOAD_A(a, kw); \
            [[unroll]] for (int i = 0; i < MB / 4; i++) \
                [[unroll]] for (int j = 0; j < NB; j++) \
                    acc[i][j] = fma(a[i], vec4(b[j]), acc[i][j]); \
        } \
    } \
    STEP_NEXT() }
#ifdef SGW
#define GEMM_GROUP() if (ACC_RUN) GEMM_RUN() else { [[unroll]] for (int u = 0; u < CU; u++) GEMM_STEP() }
#else
#define GEMM_GROUP() { [[unroll]] for (int u = 0; u < CU; u++) GEMM_STEP() }
#endif

void main() {
    int per_row = qsize.w;
    int nblk = qsize.x * qsize.y * per_row;
#ifdef SGW
    // Lanes numbered so that a subgroup's lanes are consecutive; pixel blocks padded to
    // whole subgroups, so every lane of a subgroup has the same channel block (the
    // padding lanes compute a copy of the last block and store nothing).
    int blk, cbi;
    if (CBW > 0) {
        // the workgroup's subgroups: CBW channel blocks of the same SG pixel blocks
        // (the input rows they read are still in cache for the next channel block)
        blk = int(gl_WorkGroupID.x) * SG + int(gl_SubgroupInvocationID);
        cbi = int(gl_WorkGroupID.y) * CBW + int(gl_SubgroupID);
        if (cbi >= cb_count) return;                             // (whole subgroups)
    } else {
        int nblk_pad = (nblk + SG - 1) / SG * SG;
        int lane = int(gl_WorkGroupID.x * gl_WorkGroupSize.x + gl_SubgroupID * gl_SubgroupSize
                       + gl_SubgroupInvocationID);
        blk = lane % nblk_pad;
        cbi = int(gl_WorkGroupID.y) * cbl + lane / nblk_pad;
        if (lane >= nblk_pad * cbl || cbi >= cb_count) return;  // (whole subgroups)
    }
    bool live = blk < nblk;
    blk = min(blk, nblk - 1);
#else
    int lane = int(gl_GlobalInvocationID.x);
    int blk = lane % nblk;
    int cbi = int(gl_WorkGroupID.y) * cbl + lane / nblk;   // channel block of this lane
    if (lane >= nblk * cbl || cbi >= cb_count) return;
    const bool live = true;
#endif
    // Per-lane pixel block (once), everything else uniform per workgroup.
    int qwb = blk % per_row;
    int r = blk / per_row;
    int qh = r % qsize.y;
    int qd = r / qsize.y;
    int qw0 = qwb * NB;
    int cb = cbi * MB;                               // padded output channel of the block
    int g = cb / chans.y;
    int col0 = cb - g * chans.y;
    int zi = int(gl_WorkGroupID.z);
    int n = n0 + zi / KS;
    int ks = zi - (zi / KS) * KS;                    // the slice of the reduction (KS > 1)
    int cig = chans.x;
    int kc = CU * ((cig / CU + KS - 1) / KS);        // input channels of a slice
    int c0 = ks * kc;
    int c1 = min(cig, c0 + kc);

    vec4 acc[MB / 4][NB];
    [[unroll]] for (int i = 0; i < MB / 4; i++)
        [[unroll]] for (int j = 0; j < NB; j++) acc[i][j] = vec4(0.0);

    int xb = n * xs.x + g * cig * xs.y + qd * xs.z + qh * xs.w + qw0 * SW - x_base;
#ifdef SGW
    // This lane's share of the block's weights: slot e = k * SG + lane is (channel
    // e / KW, column tap e % KW) of every (input channel, row tap); channels past the
    // group's are clamped (their results are never stored).
    const int SLOTS = MB * KW;
    const int GW = (SLOTS + SG - 1) / SG;
    int sl = int(gl_SubgroupInvocationID);
    int woff[GW];
    [[unroll]] for (int k = 0; k < GW; k++) {
        int e = min(k * SG + sl, SLOTS - 1);
        int col = min(col0 + e / KW, chans.z - 1);
        woff[k] = w_sg.w + g * w_sg_apart.x + n * w_sg_apart.y + col * w_sg.x + (e % KW) * w_sg.z;
    }
    [[dont_unroll]] for (int rt = 0; rt < nrows; rt++) {
        int t = yorg.w + rt;
        int xo = xb + rows[t >> 2][t & 3] + c0 * xs.y;
        int wo = wrows[t >> 2][t & 3] + c0 * w_sg.y;
        SC_START()
        [[dont_unroll]] for (int ci = c0; ci < c1; ci += CU) GEMM_GROUP()  // (CU divides cig)
    }
#else
    // Filters are re-laid as [image][group][row tap][channel][column tap][padded channel]
    int wstep = chans.y / 4;
    int wg = w_base + n * chans.w + g * nrows * cig * KW * wstep + col0 / 4;
    [[dont_unroll]] for (int rt = 0; rt < nrows; rt++) {
        int t = yorg.w + rt;
        int xo = xb + rows[t >> 2][t & 3] + c0 * xs.y;
        int wi = wg + (rt * cig + c0) * KW * wstep;
        SC_START()
        [[dont_unroll]] for (int ci = c0; ci < c1; ci += CU) GEMM_GROUP()  // (CU divides cig)
    }
#endif
#ifdef SGW
    // The block's bias, loaded once a subgroup (a lane's share, then shuffles at constant
    // lanes, as the weights): a storage-buffer load is a loop over the lanes on lavapipe,
    // and MB of them a lane weigh as much as a tenth of a short-K block's time.  Before
    // the return of the padding lanes: every lane of the subgroup takes part.
    const int GB = (MB + SG - 1) / SG;
    float bl[GB];
    [[unroll]] for (int k = 0; k < GB; k++) {
        int col = min(col0 + min(k * SG + sl, MB - 1), chans.z - 1);
        bl[k] = ysz.w != 0 ? FLOAD(bias, uint((g * chans.z + col) * ystep.w)) : 0.0;
    }
    float bvs[MB];
    [[unroll]] for (int e = 0; e < MB; e++) bvs[e] = subgroupShuffle(bl[e / SG], uint(e % SG));
#else
    const int GPOOL = 0;
#endif
    // (GPOOL: every lane stays for the subgroup's shuffles, its pixels counted or not)
    if (!live && GPOOL == 0) return;

    int od = yorg.x + qd * ystep.x;
    bool counted = live && od >= 0 && od < ysz.x;
    if (!counted && GPOOL == 0) return;
    // output offset of each pixel of the block; -1 where there is no output element
    int yo[NB];
    [[unroll]] for (int j = 0; j < NB; j++) {
        int q = qw0 + j;
        int oh = yorg.y + qh * ystep.y, ow;
        if (pitch > 0) {                 // flattened plane: q = row * pitch + column
            oh += (q / pitch) * ystep.y;
            ow = yorg.z + (q % pitch) * ystep.z;
        } else {
            ow = yorg.z + q * ystep.z;
        }
        bool ok = q < qsize.z && oh >= 0 && oh < ysz.y && ow >= 0 && ow < ysz.z;
        yo[j] = ok ? int(uint(n) * ys.x + uint(ks) * (ys.x / uint(KS)) + uint(od) * ys.z
                         + uint(oh) * ys.w
                         + uint(ow) * ys_w.x - uint(y_base)) : -1;
    }
#ifdef SGW
    if (GPOOL > 0) {
        // each lane sums its counted pixels, xor shuffles sum the subgroup's lanes, and
        // lane l keeps the means of channels l, l + SG, ... to store (every index a
        // constant of the unrolled loops: a dynamic one would move acc to memory)
        const int GB = (MB + SG - 1) / SG;
        float mine[GB];
        [[unroll]] for (int e = 0; e < MB; e++) {
            float t = 0.0;
            [[unroll]] for (int j = 0; j < NB; j++) {
                float v = vkml_activation(ACT, acc[e / 4][j][e % 4] + bvs[e], act);
                t += (counted && yo[j] >= 0) ? v : 0.0;
            }
            t += subgroupShuffleXor(t, 1u);
            t += subgroupShuffleXor(t, 2u);           // (SG >= 4: the host's rule)
            if (SG > 4) t += subgroupShuffleXor(t, 4u);
            if (SG > 8) t += subgroupShuffleXor(t, 8u);
            if (SG > 16) t += subgroupShuffleXor(t, 16u);
            if (SG > 32) t += subgroupShuffleXor(t, 32u);
            mine[e / SG] = (e % SG == sl || e % SG == 0) ? t : mine[e / SG];
        }
        [[unroll]] for (int k = 0; k < GB; k++) {
            int col = col0 + k * SG + sl;
            if (k * SG + sl < MB && col < chans.z)
                FSTORE(y, uint(n) * ys_w.y + uint(g * chans.z + col) * ys_w.z,
                       mine[k] / float(GPOOL));
        }
        return;
    }
#endif
    // (constant trip counts only: the block must stay in registers, a dynamic index
    // into acc would move it to memory)
    [[unroll]] for (int i4 = 0; i4 < MB / 4; i4++) {
        [[unroll]] for (int c = 0; c < 4; c++) {
            int col = col0 + i4 * 4 + c;
            int co = g * chans.z + col;
            bool has = col < chans.z;
#ifdef SGW
            float bv = bvs[i4 * 4 + c];
#else
            float bv = (has && ysz.w != 0) ? FLOAD(bias, uint(co * ystep.w)) : 0.0;
#endif
            uint yc = uint(co) * ys.y;
#ifdef V8
            if (YV4) {              // (groups of 8 pixels all exist or none, aligned)
                const int N8 = NB / 8;
                const bool HALF = (NB & 7) != 0;
                bool odd = HALF && (qw0 & 4) != 0;
                [[unroll]] for (int i = 0; i < N8; i++) {
                    int j = (odd ? 4 : 0) + 8 * i;
#ifdef RES
                    int yj = odd ? yo[min(4 + 8 * i, NB - 1)] : yo[8 * i];
                    uint rb = (has && yj >= 0) ? yc + uint(yj) : 0u;  // R's first pixel
                    float r[8];
                    vkml_u64_floats(res8[rb >> 3], r);
#define PLUS_R8(q) + r[q]
#else
#define PLUS_R8(q)
#endif
                    uvec4 u[2];
                    [[unroll]] for (int q = 0; q < 8; q++)
                        u[q >> 2][q & 3] = floatBitsToUint(vkml_activation(
                            ACT, (HALF && odd ? acc[i4][min(4 + 8 * i + q, NB - 1)][c]
                                              : acc[i4][8 * i + q][c]) + bv
                                 PLUS_R8(q), act));
#ifndef RES
                    int yj = odd ? yo[min(4 + 8 * i, NB - 1)] : yo[8 * i];
#endif
                    if (has && yj >= 0)
                        y8[(yc + uint(yj)) >> 3] = vkml_u64x4(u[0], u[1]);
                }
                if (HALF) {
#ifdef RES
                    int yj = odd ? yo[0] : yo[min(8 * N8, NB - 1)];
                    uint rb = (has && yj >= 0) ? yc + uint(yj) : 0u;
                    vec4 r4 = res4[rb >> 2];
#define PLUS_R4(q) + r4[q]
#else
#define PLUS_R4(q)
#endif
                    uvec4 u;
                    [[unroll]] for (int q = 0; q < 4; q++)
                        u[q] = floatBitsToUint(vkml_activation(
                            ACT, (odd ? acc[i4][q][c] : acc[i4][min(8 * N8 + q, NB - 1)][c]) + bv
                                 PLUS_R4(q), act));
#ifndef RES
                    int yj = odd ? yo[0] : yo[min(8 * N8, NB - 1)];
#endif
                    if (has && yj >= 0)
                        y8h[(yc + uint(yj)) >> 2] = vkml_u64x2(u);
                }
                continue;
            }
#endif
            if (YV4) {              // (groups of 4 pixels all exist or none, aligned)
                [[unroll]] for (int j = 0; j < NB; j += 4) {
#ifdef RES
                    uint rb = (has && yo[j] >= 0) ? yc + uint(yo[j]) : 0u;
#ifdef F32
                    vec4 r = res4[rb >> 2];
#else
                    vec4 r = vec4(RESID(rb), RESID(rb + 1u), RESID(rb + 2u), RESID(rb + 3u));
#endif
                    vec4 o = vec4(vkml_activation(ACT, acc[i4][j][c] + bv + r.x, act),
                                  vkml_activation(ACT, acc[i4][j + 1][c] + bv + r.y, act),
                                  vkml_activation(ACT, acc[i4][j + 2][c] + bv + r.z, act),
                                  vkml_activation(ACT, acc[i4][j + 3][c] + bv + r.w, act));
#else
                    vec4 o = vec4(vkml_activation(ACT, acc[i4][j][c] + bv, act),
                                  vkml_activation(ACT, acc[i4][j + 1][c] + bv, act),
                                  vkml_activation(ACT, acc[i4][j + 2][c] + bv, act),
                                  vkml_activation(ACT, acc[i4][j + 3][c] + bv, act));
#endif
                    if (has && yo[j] >= 0)
#ifdef F32
                        y4[(yc + uint(yo[j])) >> 2] = o;
#else                                   // (FSTORE's rounding)
                        y2[(yc + uint(yo[j])) >> 2] = uvec2(
                            vkml_half_bits(o.x) | (vkml_half_bits(o.y) << 16),
                            vkml_half_bits(o.z) | (vkml_half_bits(o.w) << 16));
#endif
                }
                continue;
            }
            // (the activation outside the store's branch: inside it, lavapipe ran an
            // exp-based one ~40x slower an element)
            [[unroll]] for (int j = 0; j < NB; j++) {
                bool ok = has && yo[j] >= 0;        // (a residual read at 0 where not)
                float v = vkml_activation(
                    ACT, acc[i4][j][c] + bv PLUS_RESID(ok ? yc + uint(yo[j]) : 0u), act);
                if (ok)
                    FSTORE(y, yc + uint(yo[j]), v);
            }
        }
    }
}
