#version 450
// Depthwise convolution (group count = input channels, any channel multiplier, stride,
// dilation, padding, 1-3 spatial dimensions), forward, reading the input in place
// through its DML strides (padding is a mask, there is no padded copy).
//
// Each invocation computes an R x NB block of one output channel: R output rows of a
// band, NB pixels of a strip.  It walks the band's input rows once: every input row is
// loaded once and added into each output row it reaches (the row loop is unrolled, so
// which accumulator row a kernel row feeds is a constant).  Lanes run along (channel,
// strip); workgroup y is the band, z the image and output depth.
//
// lavapipe's costs, which decide the shape:
// * the body has no branches: a branch lavapipe cannot prove uniform (a row outside the
//   input) makes every accumulator update inside it a masked blend; rows outside the
//   input are loaded clamped and zeroed by the same mask as the columns;
// * a storage-buffer store runs one lane at a time but stores all of a vec4 in that
//   lane's turn, while a texel-buffer imageStore takes a turn per component: float4
//   SSBO stores (V4: packed float32 rows of a multiple of 4), not RGBA imageStores;
// * V8 (devices with int64): the store loop's cost goes with components, not bytes, so
//   eight float32 outputs go as one u64vec4 (fewer components than two vec4s): ROWS's
//   strips, and without ROWS the plane stores (PW, below) or rows of NB outputs;
// * X4 reads the rows as float4 texels (packed float32 rows, the strip start aligned:
//   the misalignment (-start padding) mod 4 is the constant SHIFT).
// * PW (V4 without ROWS): rows narrower than a strip and not a multiple of 4 (14x14
//   maps) would store one float at a time, each its own lane turn, which costs more than
//   the loads and products together; where the band's R rows lie packed one after the
//   other (R * PW and the plane multiples of 4), the band is stored as float4s of the
//   flattened rows instead.
// * PC (PW, a whole plane a band, R = output height): planes whose size is not a multiple
//   of 4 (7x7: 49 floats) are not whole float4s, but PC packed planes one after the other
//   are; a lane then computes PC consecutive channels' planes and stores them as float4s
//   of the flattened (channel, row, column), not one float at a time.
// * PLANE (PC planes a lane, channel multiplier 1): the lane's PC input planes, packed one
//   after the other, are read whole as float4 texels (a 7x7 plane's rows are not whole
//   texels, so X4 cannot take them: four 7x7 planes are 49 fetches, not 324 of one float);
//   every tap's element is then a constant register and the padding a constant mask.
//
// vkml:variant convolution_depthwise_f32 F32=1 TEXEL=1
// vkml:variant convolution_depthwise_f32_v4 F32=1 TEXEL=1 V4=1
// vkml:variant convolution_depthwise_f32_v8 F32=1 TEXEL=1 V8=1
// vkml:variant convolution_depthwise_f16 F16=1 TEXEL=1
// vkml:variant convolution_depthwise_f16_packed F16_PACKED=1 TEXEL=1
// vkml:variant convolution_depthwise_f32_ssbo F32=1
// vkml:variant convolution_depthwise_f16_ssbo F16=1
// vkml:variant convolution_depthwise_f16_packed_ssbo F16_PACKED=1
// vkml:variant convolution_depthwise_rows_f32 F32=1 TEXEL=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f32_v4 F32=1 TEXEL=1 V4=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f32_v8 F32=1 TEXEL=1 V8=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f16 F16=1 TEXEL=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f16_packed F16_PACKED=1 TEXEL=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f32_ssbo F32=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f16_ssbo F16=1 ROWS=1
// vkml:variant convolution_depthwise_rows_f16_packed_ssbo F16_PACKED=1 ROWS=1
#extension GL_EXT_control_flow_attributes : require
#ifdef V8
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int NB = 8;      // output pixels per invocation (strip)
layout(constant_id = 2) const int SW = 1;      // stride along w
layout(constant_id = 3) const int KW = 3;      // kernel width
layout(constant_id = 4) const int DW = 1;      // dilation along w
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case.
// vkml:frozen ACT
layout(constant_id = 5) const int ACT = 0;     // ACT_* (vkml_activation.glsl)
layout(constant_id = 6) const int KH = 3;      // kernel height
layout(constant_id = 7) const int KD = 1;      // kernel depth
layout(constant_id = 8) const bool X4 = false; // rows read as float4 texels
layout(constant_id = 9) const int SHIFT = 0;   // X4: (-start padding along w) mod 4
layout(constant_id = 10) const int R = 1;      // output rows per invocation (band)
layout(constant_id = 11) const int SH = 1;     // stride along h
layout(constant_id = 12) const int DH = 1;     // dilation along h
layout(constant_id = 13) const int PW = 0;     // V4 or V8, > 0: plane stores, PW = output width
                                               // (one strip a row, rows packed)
layout(constant_id = 14) const int PC = 1;     // PW: channels a lane (PC > 1: R = the
                                               // output height, planes packed)
layout(constant_id = 15) const bool PLANE = false; // PW, R = the output height: the lane's
                                               // PC input planes whole as float4 texels
layout(constant_id = 16) const int IH = 1;     // PLANE: input height, width, start padding
layout(constant_id = 17) const int IW = 1;     //   along h and w
layout(constant_id = 18) const int PADH = 0;
layout(constant_id = 19) const int PADW = 0;
const int SPAN = (NB - 1) * SW + (KW - 1) * DW + 1;
const int T4 = (SPAN + SHIFT + 3) / 4;         // X4: texels per row span
const int NI = (R - 1) * SH + (KH - 1) * DH + 1;   // input rows of a band

#ifdef TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer X;      // R32F/R16F (RGBA32F with X4)
layout(set = 0, binding = 1) uniform samplerBuffer Wf;     // R32F or R16F
#define LOAD_X(i) texelFetch(X, i).x
#define LOAD_X4(t) texelFetch(X, max(t, 0))
#define LOAD_W(i) texelFetch(Wf, i).x
#else
layout(std430, set = 0, binding = 0) readonly buffer Xs { FSTORE_T xs_[]; };
layout(std430, set = 0, binding = 1) readonly buffer Ws { FSTORE_T ws_[]; };
#define LOAD_X(i) FLOAD(xs_, uint(i))
#define LOAD_W(i) FLOAD(ws_, uint(i))
#define LOAD_X4(t) vec4(0.0)          // (X4 is a texel-buffer mode)
#endif
layout(std430, set = 0, binding = 2) readonly buffer Bias { FSTORE_T bias[]; };
#if defined(V8)
layout(std430, set = 0, binding = 3) writeonly buffer Y8 { u64vec4 y8[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y8h { u64vec2 y8h[]; };
#elif defined(V4)
layout(std430, set = 0, binding = 3) writeonly buffer Y4 { vec4 y4[]; };
#else
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
#endif
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 in_size;      // D, H, W, channel multiplier
    ivec4 out_size;     // D, H, W (valid positions), strips per row
    ivec4 flags;        // KD, KH (the kernel reads its constants), -, has bias
    ivec4 stride;       // d, h, -, bias stride
    ivec4 dil;          // d, h, -, -
    ivec4 pad;          // start padding d, h, w
    ivec4 xs;           // input strides n, c, d, h
    ivec4 ws;           // filter strides co, kd, kh, kw
    uvec4 ys;           // output strides n, c, d, h
    ivec4 last;         // input stride w, output stride w, flip, output channels
    vec4 act;
};
layout(push_constant) uniform Push {
    int n0;             // first image of this dispatch
    int c0;             // first output channel of this dispatch
};

#ifdef ROWS
// ROWS: each invocation walks R output rows of its strip in a rolled loop (SH = DH = 1,
// KD = 1), keeping the KH input rows of the current output row in registers: every
// input row of the band is loaded once and each output row is stored as soon as it is
// complete, so the live set is KH rows + NB sums, not R x NB sums.
// input row ih (clamped; zeros outside the input) into win[K]
#define LOAD_ROW(K, IH) {                                                           \
    int ih_ = (IH);                                                                 \
    bool ok_ = ih_ >= 0 && ih_ < in_size.y;                                         \
    int xrow_ = xd + clamp(ih_, 0, in_size.y - 1) * xs.w;                           \
    if (X4) {                                                                       \
        int t0_ = (xrow_ + iw0 - SHIFT) >> 2;                                       \
        [[unroll]] for (int t = 0; t < T4; t++) {                                   \
            vec4 v_ = LOAD_X4(t0_ + t);                                             \
            [[unroll]] for (int q = 0; q < 4; q++)                                  \
                win[K][t * 4 + q] = (ok_ && inw[t * 4 + q]) ? v_[q] : 0.0;          \
        }                                                                           \
    } else {                                                                        \
        [[unroll]] for (int e = 0; e < SPAN; e++) {                                 \
            float v_ = LOAD_X(xrow_ + cw[e]);                                       \
            win[K][e] = (ok_ && inw[e]) ? v_ : 0.0;                                 \
        }                                                                           \
    }                                                                               \
}

void main() {
    int strips = out_size.w;
    int lane = int(gl_GlobalInvocationID.x);
    int co = lane / strips;                 // (once per lane)
    int strip = lane - co * strips;
    co += c0;
    bool live = co < last.w;                // (a flag, not a return: see DEVELOPING.md)
    co = min(co, last.w - 1);
    int oh0 = int(gl_WorkGroupID.y) * R;
    int oh1 = min(oh0 + R, out_size.y);
    int z = int(gl_WorkGroupID.z);
    int od = z % out_size.x;
    int n = n0 + z / out_size.x;
    int ci = co / in_size.w;
    bool flip = last.z != 0;
    int ow0 = strip * NB;
    int iw0 = ow0 * SW - pad.z;

    const int E = X4 ? T4 * 4 : SPAN;
    bool inw[E];
    int cw[E];
    [[unroll]] for (int e = 0; e < E; e++) {
        int iw = X4 ? iw0 - SHIFT + e : iw0 + e;
        inw[e] = iw >= 0 && iw < in_size.z;
        cw[e] = clamp(iw, 0, in_size.z - 1) * last.x;
    }
    float wv[KH][KW];
    [[unroll]] for (int kh = 0; kh < KH; kh++)
        [[unroll]] for (int kw = 0; kw < KW; kw++)
            wv[kh][kw] = LOAD_W(co * ws.x + (flip ? KH - 1 - kh : kh) * ws.z
                                + (flip ? KW - 1 - kw : kw) * ws.w);
    float bv = flags.w != 0 ? FLOAD(bias, uint(co * stride.w)) : 0.0;
    int id = od * stride.x - pad.x;         // (KD = 1)
    bool dok = id >= 0 && id < in_size.x;
    int xd = n * xs.x + ci * xs.y + clamp(id, 0, in_size.x - 1) * xs.z;
    float win[KH][E];
    [[unroll]] for (int k = 0; k + 1 < KH; k++)
        LOAD_ROW(k + 1, dok ? oh0 - pad.y + k : -1)
    uint yc = uint(n) * ys.x + uint(co) * ys.y + uint(od) * ys.z;
    [[dont_unroll]] for (int oh = oh0; oh < oh1; oh++) {
        [[unroll]] for (int k = 0; k + 1 < KH; k++)
            [[unroll]] for (int e = 0; e < E; e++) win[k][e] = win[k + 1][e];
        LOAD_ROW(KH - 1, dok ? oh - pad.y + KH - 1 : -1)
        float acc[NB];
        [[unroll]] for (int j = 0; j < NB; j++) acc[j] = bv;
        [[unroll]] for (int kh = 0; kh < KH; kh++)
            [[unroll]] for (int kw = 0; kw < KW; kw++)
                [[unroll]] for (int j = 0; j < NB; j++)
                    acc[j] = fma(wv[kh][kw], win[kh][(X4 ? SHIFT : 0) + kw * DW + j * SW], acc[j]);
        uint yb = yc + uint(oh) * ys.w;
#if defined(V8)
        // NB = 8 N8 (+ 4): a strip starting 8-aligned stores N8 u64vec4s from its start
        // and a u64vec2 at its end; one starting 4 past 8 (an odd strip, or a row of
        // 8 k + 4 outputs after one that is not) the u64vec2 first (the outputs to store
        // picked by selects, not branches)
        const int N8 = NB / 8;
        const bool HALF = (NB & 7) != 0;
        bool odd = HALF && ((yb + uint(ow0)) & 4u) != 0u;
        // (every activation outside the stores' branches: inside one, lavapipe ran an
        // exp-based activation several times slower)
        [[unroll]] for (int i = 0; i < N8; i++) {
            int j = (odd ? 4 : 0) + 8 * i;
            uvec4 u[2];
            [[unroll]] for (int q = 0; q < 8; q++)
                u[q >> 2][q & 3] = floatBitsToUint(vkml_activation(
                    ACT, HALF ? (odd ? acc[4 + 8 * i + q] : acc[8 * i + q]) : acc[8 * i + q],
                    act));
            if (live && ow0 + j < out_size.z)
                y8[(yb + uint(ow0 + j)) >> 3] = vkml_u64x4(u[0], u[1]);
        }
        if (HALF) {
            int j = odd ? 0 : 8 * N8;
            uvec4 u;
            [[unroll]] for (int q = 0; q < 4; q++)
                u[q] = floatBitsToUint(vkml_activation(
                    ACT, odd ? acc[q] : acc[min(8 * N8 + q, NB - 1)], act));
            if (live && ow0 + j < out_size.z)
                y8h[(yb + uint(ow0 + j)) >> 2] = vkml_u64x2(u);
        }
#elif defined(V4)
        [[unroll]] for (int j = 0; j < NB; j += 4) {
            vec4 v;
            [[unroll]] for (int q = 0; q < 4; q++)
                v[q] = vkml_activation(ACT, acc[j + q], act);
            if (live && ow0 + j < out_size.z)
                y4[(yb + uint(ow0 + j)) >> 2] = v;
        }
#else
        [[unroll]] for (int j = 0; j < NB; j++) {
            float v = vkml_activation(ACT, acc[j], act);
            if (live && ow0 + j < out_size.z)
                FSTORE(y, yb + uint((ow0 + j) * last.y), v);
        }
#endif
    }
}
#else
void main() {
    int strips = out_size.w;
    int lane = int(gl_GlobalInvocationID.x);
    int cq = lane / strips;                 // (once per lane)
    int strip = lane - cq * strips;
    int cb = c0 + cq * PC;                  // the lane's first output channel
    if (cb >= last.w) return;
    int oh0 = int(gl_WorkGroupID.y) * R;
    int z = int(gl_WorkGroupID.z);
    int od = z % out_size.x;
    int n = n0 + z / out_size.x;
    bool flip = last.z != 0;
    int ow0 = strip * NB;
    int iw0 = ow0 * SW - pad.z;
    int ih0 = oh0 * SH - pad.y;

    // which elements of a row span lie inside the input (the same for every row);
    // element e is input column iw0 - SHIFT + e (X4) or iw0 + e
    const int E = X4 ? T4 * 4 : SPAN;
    bool inw[E];
    int cw[E];                  // clamped column offsets (scalar loads)
    [[unroll]] for (int e = 0; e < E; e++) {
        int iw = X4 ? iw0 - SHIFT + e : iw0 + e;
        inw[e] = iw >= 0 && iw < in_size.z;
        cw[e] = clamp(iw, 0, in_size.z - 1) * last.x;
    }
    float acc[PC][R][NB];
    float bv[PC];
    if (PLANE) {        // (KD = 1, one output depth, R = OH, NB = OW, one strip)
        const int PE = PC * IH * IW;
        float zero = intBitsToFloat(pad.w);     // (the block's unused member: 0)
        float xin[PE];
        int t0 = (n * xs.x + cb * xs.y) >> 2;
        [[unroll]] for (int t = 0; t < PE / 4; t++) {
            vec4 v = LOAD_X4(t0 + t);
            [[unroll]] for (int q = 0; q < 4; q++) xin[4 * t + q] = v[q];
        }
        [[unroll]] for (int p = 0; p < PC; p++) {
            int co = cb + p;
            float wv[KH][KW];
            [[unroll]] for (int kh = 0; kh < KH; kh++)
                [[unroll]] for (int kw = 0; kw < KW; kw++)
                    wv[kh][kw] = LOAD_W(co * ws.x + (flip ? KH - 1 - kh : kh) * ws.z
                                        + (flip ? KW - 1 - kw : kw) * ws.w);
            [[unroll]] for (int r = 0; r < R; r++)
                [[unroll]] for (int j = 0; j < NB; j++) {
                    float a = 0.0;
                    [[unroll]] for (int kh = 0; kh < KH; kh++) {
                        int ih = r * SH - PADH + kh * DH;              // (constants)
                        [[unroll]] for (int kw = 0; kw < KW; kw++) {
                            int iw = j * SW - PADW + kw * DW;
                            // (a padded tap adds w * 0, as the rows read apart do:
                            // the same bits, an infinite weight's NaN included; the zero
                            // is read at run time, since drivers fold a constant one's
                            // product away)
                            bool inside = ih >= 0 && ih < IH && iw >= 0 && iw < IW;
                            a = fma(wv[kh][kw], inside ? xin[clamp(p * IH * IW + ih * IW
                                                                   + iw, 0, PE - 1)] : zero,
                                    a);
                        }
                    }
                    acc[p][r][j] = a;
                }
            bv[p] = flags.w != 0 ? FLOAD(bias, uint(co * stride.w)) : 0.0;
        }
    }
    // (PC > 1: the host takes it only where the channel count is a multiple of PC)
    [[unroll]] for (int p = 0; p < (PLANE ? 0 : PC); p++) {
        int co = cb + p;
        int ci = co / in_size.w;
        [[unroll]] for (int r = 0; r < R; r++)
            [[unroll]] for (int j = 0; j < NB; j++) acc[p][r][j] = 0.0;
        int xc = n * xs.x + ci * xs.y;
        [[unroll]] for (int kd = 0; kd < KD; kd++) {
            int id = od * stride.x - pad.x + kd * dil.x;
            bool dok = id >= 0 && id < in_size.x;
            int fd = flip ? KD - 1 - kd : kd;
            float wv[KH][KW];
            [[unroll]] for (int kh = 0; kh < KH; kh++)
                [[unroll]] for (int kw = 0; kw < KW; kw++)
                    wv[kh][kw] = LOAD_W(co * ws.x + fd * ws.y + (flip ? KH - 1 - kh : kh) * ws.z
                                        + (flip ? KW - 1 - kw : kw) * ws.w);
            int xd = xc + clamp(id, 0, in_size.x - 1) * xs.z;
            [[unroll]] for (int i = 0; i < NI; i++) {
                int ih = ih0 + i;
                bool ok = dok && ih >= 0 && ih < in_size.y;
                int xrow = xd + clamp(ih, 0, in_size.y - 1) * xs.w;
                float b[E];
                if (X4) {
                    int t0 = (xrow + iw0 - SHIFT) >> 2;
                    [[unroll]] for (int t = 0; t < T4; t++) {
                        vec4 v = LOAD_X4(t0 + t);
                        [[unroll]] for (int q = 0; q < 4; q++)
                            b[t * 4 + q] = (ok && inw[t * 4 + q]) ? v[q] : 0.0;
                    }
                } else {
                    [[unroll]] for (int e = 0; e < E; e++) {
                        float v = LOAD_X(xrow + cw[e]);
                        b[e] = (ok && inw[e]) ? v : 0.0;
                    }
                }
                [[unroll]] for (int kh = 0; kh < KH; kh++) {
                    int rr = i - kh * DH;
                    if (rr >= 0 && rr % SH == 0 && rr / SH < R) {       // (constants)
                        [[unroll]] for (int kw = 0; kw < KW; kw++)
                            [[unroll]] for (int j = 0; j < NB; j++)
                                acc[p][rr / SH][j] = fma(wv[kh][kw],
                                                         b[(X4 ? SHIFT : 0) + kw * DW + j * SW],
                                                         acc[p][rr / SH][j]);
                    }
                }
            }
        }
        bv[p] = flags.w != 0 ? FLOAD(bias, uint(co * stride.w)) : 0.0;
    }
    uint yb = uint(n) * ys.x + uint(cb) * ys.y + uint(od) * ys.z + uint(oh0) * ys.w;
#ifdef V8
    if (PW > 0) {
        // the lane's T floats from yb, a multiple of 4, as u64vec4s where yb is 8-aligned,
        // else a u64vec2 first; the band ends where the output's rows do (whole bands, or
        // whole planes: the host's rule), so every store is the output's.  The outputs of
        // each store are picked by selects on that parity, not branches.
        const int BAND = R * PW;
        const int T = PC * BAND;
        const int N8 = T / 8;
        const bool HALF = (T & 7) != 0;
        bool odd = (yb & 4u) != 0u;
        // the lane's float f (a constant): channel f / BAND, row f % BAND / PW, column f % PW
#define PLANE_AT(f) (acc[(f) / BAND][(f) % BAND / PW][(f) % PW] + bv[(f) / BAND])
        // even: u64vec4 i at 8 i (i < N8), then (HALF) a u64vec2 at 8 N8;
        // odd: a u64vec2 at 0, u64vec4 i at 4 + 8 i (i < N8 - 1 + HALF), then (!HALF)
        // a u64vec2 at T - 4
        [[unroll]] for (int i = 0; i < N8; i++) {
            uvec4 u[2];
            [[unroll]] for (int q = 0; q < 8; q++) {
                float a = odd ? PLANE_AT(min(4 + 8 * i + q, T - 1)) : PLANE_AT(8 * i + q);
                u[q >> 2][q & 3] = floatBitsToUint(vkml_activation(ACT, a, act));
            }
            if (!odd || HALF || i < N8 - 1)
                y8[(yb + uint(odd ? 4 + 8 * i : 8 * i)) >> 3] = vkml_u64x4(u[0], u[1]);
        }
        // the u64vec2s: where odd, at 0 and (!HALF) at T - 4; else (HALF) at 8 N8
        [[unroll]] for (int h = 0; h < (HALF ? 1 : 2); h++) {
            int fo = h == 0 ? 0 : T - 4, fe = min(8 * N8, T - 4);       // (constants)
            uvec4 u;
            [[unroll]] for (int q = 0; q < 4; q++)
                u[q] = floatBitsToUint(vkml_activation(
                    ACT, odd ? PLANE_AT(fo + q) : PLANE_AT(fe + q), act));
            if (odd || HALF)
                y8h[(yb + uint(odd ? fo : fe)) >> 2] = vkml_u64x2(u);
        }
#undef PLANE_AT
        return;
    }
    // rows of NB outputs as u64vec4s (NB, the output width and every stride multiples of
    // 8: the host's rule, so a group of eight lies in the output whole or not at all)
    [[unroll]] for (int r = 0; r < R; r++) {
        bool row = oh0 + r < out_size.y;
        uint yr = yb + uint(r) * ys.w;
        [[unroll]] for (int j = 0; j < NB; j += 8) {
            uvec4 u[2];
            [[unroll]] for (int q = 0; q < 8; q++)
                u[q >> 2][q & 3] = floatBitsToUint(
                    vkml_activation(ACT, acc[0][r][j + q] + bv[0], act));
            if (row && ow0 + j < out_size.z)
                y8[(yr + uint(ow0 + j)) >> 3] = vkml_u64x4(u[0], u[1]);
        }
    }
#else
#ifdef V4
    if (PW > 0) {
        // band element f is channel f / (R * PW), row f % (R * PW) / PW, column f % PW
        // (constants); a float4 lies in the output where its last row does (the plane is
        // whole float4s, or PC planes are: then every row is the output's)
        const int BAND = R * PW;
        [[unroll]] for (int f = 0; f < PC * BAND; f += 4) {
            vec4 v;
            [[unroll]] for (int q = 0; q < 4; q++) {
                int p = (f + q) / BAND, e = (f + q) % BAND;
                v[q] = vkml_activation(ACT, acc[p][e / PW][e % PW] + bv[p], act);
            }
            if (oh0 + (f + 3) % BAND / PW < out_size.y)
                y4[(yb + uint(f)) >> 2] = v;
        }
        return;
    }
#endif
    [[unroll]] for (int r = 0; r < R; r++) {
        bool row = oh0 + r < out_size.y;
        uint yr = yb + uint(r) * ys.w;
#ifdef V4
        [[unroll]] for (int j = 0; j < NB; j += 4) {
            vec4 v;
            [[unroll]] for (int q = 0; q < 4; q++)
                v[q] = vkml_activation(ACT, acc[0][r][j + q] + bv[0], act);
            if (row && ow0 + j < out_size.z)
                y4[(yr + uint(ow0 + j)) >> 2] = v;
        }
#else
        [[unroll]] for (int j = 0; j < NB; j++) {
            float v = vkml_activation(ACT, acc[0][r][j] + bv[0], act);
            if (row && ow0 + j < out_size.z)
                FSTORE(y, yr + uint((ow0 + j) * last.y), v);
        }
#endif
    }
#endif
}
#endif
