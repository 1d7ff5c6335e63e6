#version 450
// Convolution as a shared-memory tiled implicit GEMM (the design GPU libraries use):
// a workgroup computes a tile of TM output channels x TN output pixels of one image and
// one group; the reduction over (filter tap, input channel) is staged through shared
// memory TK input channels at a time, every invocation loading a float4 of the filter
// tile and of the input tile (the im2col column is never built: each pixel's input
// position for the tap is computed once per tap), then adding the RM x RN products of
// its register block from shared memory, float4 against float4.
//
//   A tile  As[kk][m / 4] = filter[g*Cout/g + m0 + m][c0 + kk][tap]     (4 channels a vec4)
//   B tile  Bs[kk][p / 4] = input[n][g*Cin/g + c0 + kk][position(p, tap)] (4 pixels a vec4)
//   acc[m][p] += As[kk][m] * Bs[kk][p]
//
// Forward convolutions of any kernel, stride, dilation, padding and group count, 1 to 3
// spatial dimensions, read and written through their DML strides; the epilogue adds
// the bias and applies the fused activation (ops/convolution/tiled.py).
//
// vkml:variant convolution_tiled_f32 F32=1
// vkml:variant convolution_tiled_f16 F16=1
// vkml:variant convolution_tiled_f16_packed F16_PACKED=1
// vkml:variant convolution_tiled_f16_arith F16=1 F16_ARITH=1
//
// F16_ARITH (devices with shaderFloat16 and 16-bit storage): the tiles are float16 and
// each stage's TK products are summed in float16, then added to float32 accumulators:
// per output |error| <= (TK + 1) * 2^-11 * sum_k |w_k x_k| + the float16 output rounding.
#extension GL_EXT_control_flow_attributes : require
#ifdef F16_ARITH
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define TILE_T f16vec4
#define TILE_S float16_t
#else
#define TILE_T vec4
#define TILE_S float
#endif
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;                // (TM / RM) * (TN / RN)
layout(constant_id = 1) const int TM = 64;     // output channels per workgroup (x4)
layout(constant_id = 2) const int TN = 64;     // output pixels per workgroup (x4)
layout(constant_id = 3) const int TK = 16;     // input channels per shared-memory stage
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: RM and RN size the register block, whose
// loops must unroll to keep it in registers; ACT selects code in vkml_activation.glsl's switch,
// which SwiftShader otherwise runs case by case.
// vkml:frozen RM RN ACT
layout(constant_id = 4) const int RM = 4;      // output channels per invocation (x4)
layout(constant_id = 5) const int RN = 4;      // output pixels per invocation (x4)
layout(constant_id = 6) const int ACT = 0;     // ACT_* (vkml_activation.glsl)

layout(std430, set = 0, binding = 0) readonly buffer X { FSTORE_T x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { FSTORE_T w[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { FSTORE_T bias[]; };
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 isz;      // input D, H, W; input channels per group
    ivec4 osz;      // output D, H, W; output channels per group
    ivec4 ksz;      // kernel D, H, W; flipped (CONVOLUTION mode)
    ivec4 str;      // strides D, H, W; has bias
    ivec4 dil;      // dilations D, H, W; channel tiles per group
    ivec4 pad;      // start padding D, H, W; output pixels per image (D*H*W)
    uvec4 xs;       // input element strides: image, channel, d, h
    uvec4 ws;       // filter element strides: output channel, input channel, d, h
    uvec4 ys;       // output element strides: image, channel, d, h
    uvec4 s2;       // element strides along w: input, filter, output; bias channel stride
    vec4 act;       // activation parameters
};

const int LX = TN / RN;                         // invocations along pixels
const int TN4 = TN / 4, TM4 = TM / 4, RN4 = RN / 4, RM4 = RM / 4;
const int LOCAL = (TM / RM) * (TN / RN);
const int B_ROWS = LOCAL / TN4;                 // tile rows one pass of loads covers
const int A_ROWS = LOCAL / TM4;

shared TILE_T As[TK * TM4];
shared TILE_T Bs[TK * TN4];

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int tx = tid % LX, ty = tid / LX;
    int p0 = int(gl_WorkGroupID.x) * TN;
    int g = int(gl_WorkGroupID.y) / dil.w;
    int m0 = (int(gl_WorkGroupID.y) - g * dil.w) * TM;
    uint n = gl_WorkGroupID.z;
    int cig = isz.w, cog = osz.w;
    int npix = pad.w;
    int ohw = osz.y * osz.z;

    // this invocation's share of the B tile: pixels 4 bp .. 4 bp + 3, rows br, br + B_ROWS, ...
    int bp = tid % TN4, br = tid / TN4;
    ivec3 base[4];                              // input position of each pixel at tap 0
    [[unroll]] for (int e = 0; e < 4; e++) {
        int p = p0 + bp * 4 + e;
        int od = p / ohw, r = p - od * ohw;
        int oh = r / osz.z, ow = r - oh * osz.z;
        base[e] = p < npix ? ivec3(od, oh, ow) * str.xyz - pad.xyz : ivec3(-(1 << 30));
    }
    uint xg = n * xs.x + uint(g * cig) * xs.y;
    // its share of the A tile: channels 4 am .. 4 am + 3, rows ar, ar + A_ROWS, ...
    int am = tid % TM4, ar = tid / TM4;
    uint wrow[4];
    bool wok[4];
    [[unroll]] for (int c = 0; c < 4; c++) {
        int m = m0 + am * 4 + c;
        wok[c] = m < cog;
        wrow[c] = uint(g * cog + min(m, cog - 1)) * ws.x;
    }

    vec4 acc[RM][RN4];
    [[unroll]] for (int i = 0; i < RM; i++)
        [[unroll]] for (int j = 0; j < RN4; j++) acc[i][j] = vec4(0.0);

    int taps = ksz.x * ksz.y * ksz.z;
    [[dont_unroll]] for (int t = 0; t < taps; t++) {
        int kd = t / (ksz.y * ksz.z), kr = t - kd * ksz.y * ksz.z;
        int kh = kr / ksz.z, kw = kr - kh * ksz.z;
        ivec3 off = ivec3(kd, kh, kw) * dil.xyz;
        ivec3 kf = ksz.w != 0 ? ksz.xyz - 1 - ivec3(kd, kh, kw) : ivec3(kd, kh, kw);
        uint wt = uint(kf.x) * ws.z + uint(kf.y) * ws.w + uint(kf.z) * s2.y;
        // input element of each of this invocation's pixels at this tap (-1: padding)
        int xo[4];
        [[unroll]] for (int e = 0; e < 4; e++) {
            ivec3 q = base[e] + off;
            bool in_ = all(greaterThanEqual(q, ivec3(0))) && all(lessThan(q, isz.xyz));
            xo[e] = in_ ? int(xg + uint(q.x) * xs.z + uint(q.y) * xs.w + uint(q.z) * s2.x) : -1;
        }
        [[dont_unroll]] for (int c0 = 0; c0 < cig; c0 += TK) {
            barrier();                          // the previous stage's reads are done
            for (int kk = br; kk < TK; kk += B_ROWS) {
                int ci = c0 + kk;
                uint xc = uint(ci) * xs.y;
                vec4 v = vec4(0.0);
                [[unroll]] for (int e = 0; e < 4; e++)
                    if (ci < cig && xo[e] >= 0) v[e] = FLOAD(x, uint(xo[e]) + xc);
                Bs[kk * TN4 + bp] = TILE_T(v);
            }
            for (int kk = ar; kk < TK; kk += A_ROWS) {
                int ci = c0 + kk;
                uint wc = uint(min(ci, cig - 1)) * ws.y + wt;
                vec4 v = vec4(0.0);
                [[unroll]] for (int c = 0; c < 4; c++)
                    if (ci < cig && wok[c]) v[c] = FLOAD(w, wrow[c] + wc);
                As[kk * TM4 + am] = TILE_T(v);
            }
            barrier();
#ifdef F16_ARITH
            f16vec4 part[RM][RN4];
            [[unroll]] for (int i = 0; i < RM; i++)
                [[unroll]] for (int j = 0; j < RN4; j++) part[i][j] = f16vec4(0.0);
#define PART part
#else
#define PART acc
#endif
            [[dont_unroll]] for (int kk = 0; kk < TK; kk++) {
                TILE_T a[RM4], b[RN4];
                [[unroll]] for (int i = 0; i < RM4; i++) a[i] = As[kk * TM4 + ty * RM4 + i];
                [[unroll]] for (int j = 0; j < RN4; j++) b[j] = Bs[kk * TN4 + tx * RN4 + j];
                [[unroll]] for (int i = 0; i < RM4; i++)
                    [[unroll]] for (int c = 0; c < 4; c++)
                        [[unroll]] for (int j = 0; j < RN4; j++)
                            PART[i * 4 + c][j] = fma(TILE_T(a[i][c]), b[j], PART[i * 4 + c][j]);
            }
#ifdef F16_ARITH
            [[unroll]] for (int i = 0; i < RM; i++)
                [[unroll]] for (int j = 0; j < RN4; j++) acc[i][j] += vec4(part[i][j]);
#endif
        }
    }

    // epilogue: bias, activation, store through the output's strides
    uint yg = n * ys.x;
    [[unroll]] for (int j = 0; j < RN4; j++) {
        [[unroll]] for (int e = 0; e < 4; e++) {
            int p = p0 + (tx * RN4 + j) * 4 + e;
            if (p >= npix) continue;
            int od = p / ohw, r = p - od * ohw;
            int oh = r / osz.z, ow = r - oh * osz.z;
            uint yp = yg + uint(od) * ys.z + uint(oh) * ys.w + uint(ow) * s2.z;
            [[unroll]] for (int i = 0; i < RM; i++) {
                int m = m0 + ty * RM + i;
                if (m >= cog) continue;
                int co = g * cog + m;
                float bv = str.w != 0 ? FLOAD(bias, uint(co) * s2.w) : 0.0;
                float v = vkml_activation(ACT, acc[i][j][e] + bv, act);
                FSTORE(y, yp + uint(co) * ys.y, v);
            }
        }
    }
}
