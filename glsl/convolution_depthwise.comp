#version 450
// Depthwise convolution (group count = input channels, any channel multiplier), forward:
// each invocation computes NB consecutive output pixels of one row of one output channel,
// reading the input in place through its DML strides.  Per kernel row it loads the
// input span the block needs once (zero outside the input: padding is a mask, there is
// no padded copy) and reuses it for every kernel column.  The channel is uniform per
// workgroup, so the filter taps are uniform loads.
//
// Memory-bound, so the widths of the accesses decide (lavapipe, per 8 lanes: an RGBA32F
// texel fetch ~8 ns, an R32F one ~5 ns, a storage-buffer access one lane at a time):
// X4 reads the rows as float4 texels (packed float32 rows, the block start aligned: the
// misalignment (-start padding) mod 4 is the constant SHIFT), and the _img variants
// store float4 texels through a storage texel buffer (packed float32 output rows of a
// multiple of 4).
//
// vkml:variant convolution_depthwise_f32 F32=1 TEXEL=1
// vkml:variant convolution_depthwise_f32_img F32=1 TEXEL=1 IMG_OUT=1
// vkml:variant convolution_depthwise_f16 F16=1 TEXEL=1
// vkml:variant convolution_depthwise_f16_packed F16_PACKED=1 TEXEL=1
// vkml:variant convolution_depthwise_f32_ssbo F32=1
// vkml:variant convolution_depthwise_f16_ssbo F16=1
// vkml:variant convolution_depthwise_f16_packed_ssbo F16_PACKED=1
#extension GL_EXT_control_flow_attributes : require
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int NB = 8;      // output pixels per invocation
layout(constant_id = 2) const int SW = 1;      // stride along w
layout(constant_id = 3) const int KW = 3;      // kernel width
layout(constant_id = 4) const int DW = 1;      // dilation along w
layout(constant_id = 5) const int ACT = 0;     // ACT_* (vkml_activation.glsl)
layout(constant_id = 6) const int KH = 3;      // kernel height (unrolled)
layout(constant_id = 7) const int KD = 1;      // kernel depth (unrolled)
layout(constant_id = 8) const bool X4 = false; // rows read as float4 texels
layout(constant_id = 9) const int SHIFT = 0;   // X4: (-start padding along w) mod 4
const int SPAN = (NB - 1) * SW + (KW - 1) * DW + 1;
const int T4 = (SPAN + SHIFT + 3) / 4;         // X4: texels per row span

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
#ifdef IMG_OUT
layout(set = 0, binding = 3, rgba32f) uniform writeonly imageBuffer Yimg;
#else
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
#endif
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 in_size;      // D, H, W, channel multiplier
    ivec4 out_size;     // D, H, W (valid positions), pixel blocks per row
    ivec4 misc;         // -, -, -, has bias
    ivec4 stride;       // d, h, -, bias stride
    ivec4 dil;          // d, h, -, -
    ivec4 pad;          // start padding d, h, w
    ivec4 xs;           // input strides n, c, d, h
    ivec4 ws;           // filter strides co, kd, kh, kw
    uvec4 ys;           // output strides n, c, d, h
    ivec4 last;         // input stride w, output stride w, flip, -
    vec4 act;
};
layout(push_constant) uniform Push {
    int n0;             // first image of this dispatch
    int c0;             // first output channel of this dispatch
};

void main() {
    int per_row = out_size.w;
    int blk = int(gl_GlobalInvocationID.x);
    if (blk >= out_size.x * out_size.y * per_row) return;
    int owb = blk % per_row;
    int r = blk / per_row;
    int oh = r % out_size.y;
    int od = r / out_size.y;
    int ow0 = owb * NB;
    int co = c0 + int(gl_WorkGroupID.y);
    int n = n0 + int(gl_WorkGroupID.z);
    int ci = co / in_size.w;
    bool flip = last.z != 0;

    float acc[NB];
    [[unroll]] for (int j = 0; j < NB; j++) acc[j] = 0.0;
    int xc = n * xs.x + ci * xs.y;
    int iw0 = ow0 * SW - pad.z;
    [[unroll]] for (int kd = 0; kd < KD; kd++) {
        int id = od * stride.x - pad.x + kd * dil.x;
        if (id < 0 || id >= in_size.x) continue;
        [[unroll]] for (int kh = 0; kh < KH; kh++) {
            int ih = oh * stride.y - pad.y + kh * dil.y;
            if (ih < 0 || ih >= in_size.y) continue;
            int xrow = xc + id * xs.z + ih * xs.w;
            float b[T4 * 4];        // (>= SPAN)
            if (X4) {               // b[e] = input w position iw0 - SHIFT + e
                int t0 = (xrow + iw0 - SHIFT) >> 2;
                [[unroll]] for (int t = 0; t < T4; t++) {
                    vec4 v = LOAD_X4(t0 + t);
                    [[unroll]] for (int q = 0; q < 4; q++) {
                        int iw = iw0 - SHIFT + t * 4 + q;
                        b[t * 4 + q] = (iw >= 0 && iw < in_size.z) ? v[q] : 0.0;
                    }
                }
            } else {                // b[e] = input w position iw0 + e
                [[unroll]] for (int e = 0; e < SPAN; e++) {
                    int iw = iw0 + e;
                    bool ok = iw >= 0 && iw < in_size.z;
                    b[e] = ok ? LOAD_X(xrow + clamp(iw, 0, in_size.z - 1) * last.x) : 0.0;
                }
            }
            int fd = flip ? KD - 1 - kd : kd;
            int fh = flip ? KH - 1 - kh : kh;
            int wrow = co * ws.x + fd * ws.y + fh * ws.z;
            [[unroll]] for (int kw = 0; kw < KW; kw++) {
                float wv = LOAD_W(wrow + (flip ? KW - 1 - kw : kw) * ws.w);
                [[unroll]] for (int j = 0; j < NB; j++)
                    acc[j] = fma(wv, b[(X4 ? SHIFT : 0) + kw * DW + j * SW], acc[j]);
            }
        }
    }
    float bv = misc.w != 0 ? FLOAD(bias, uint(co * stride.w)) : 0.0;
    uint yb = uint(n) * ys.x + uint(co) * ys.y + uint(od) * ys.z + uint(oh) * ys.w;
#ifdef IMG_OUT
    [[unroll]] for (int j = 0; j < NB; j += 4) {
        if (ow0 + j < out_size.z) {
            vec4 v;
            [[unroll]] for (int q = 0; q < 4; q++) v[q] = vkml_activation(ACT, acc[j + q] + bv, act);
            imageStore(Yimg, int(yb + uint(ow0 + j)) >> 2, v);
        }
    }
#else
    [[unroll]] for (int j = 0; j < NB; j++) {
        if (ow0 + j < out_size.z)
            FSTORE(y, yb + uint((ow0 + j) * last.y), vkml_activation(ACT, acc[j] + bv, act));
    }
#endif
}
