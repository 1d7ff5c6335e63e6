#version 450
// Register-blocked GEMMs with small blocks of compile-time size (RM x RN; the runtime
// freezes both into the module, its vkml:frozen line):
// every loop over the block unrolls and the block stays in registers even on drivers
// that do not fold specialization constants (SwiftShader, which otherwise keeps the
// block in memory).  The lanes of a workgroup take
// consecutive pixels (a lane's RN pixels are LOCAL_SIZE_X apart) and share the
// workgroup's RM output channels, so every lane reads the same weights.
//
// CONV (ops/convolution/blocked.py): a convolution read and written in place through its
// DML strides, any kernel, stride, dilation, padding and group count, 1 to 3 spatial
// dimensions.  For each filter tap, each pixel's input position is computed once; the
// input-channel loop then only loads and multiplies (a padding position reads element 0,
// times 0).  Bias and the fused activation in the epilogue.  The parameter block
// describes a forward convolution per axis: output j reads input j*str - pad + t*dil at
// tap t, and writes y at y0 + j*(its strides); tap t's filter element is
// ws.w + t*wt (signed steps, so the CONVOLUTION mode's flip is a negative step).  A
// transposed convolution (BACKWARD direction) is dispatched once per stride phase
// (blocked.py, _phase_axis): the outputs o = o0 + j*stride whose taps are
// k = k0 + t*step (step = stride / gcd(stride, dilation)) read input
// base + j - t*dilation/gcd, so str = 1, dil = -dilation/gcd, pad = -base, every
// product contributes but the padding ones, and no pixel tests divisibility.
//
// GEMM (Winograd's 36 GEMMs, ops/convolution/winograd.py): C[b][m][n] = sum_k
// A[b][k][m] B[b][k][n] on float32 buffers, raw store.
//
// vkml:variant convolution_blocked_f32 CONV=1 F32=1
// vkml:variant convolution_blocked_f16 CONV=1 F16=1
// vkml:variant convolution_blocked_f16_packed CONV=1 F16_PACKED=1
// vkml:variant convolution_blocked_gemm GEMM=1 F32=1
#extension GL_EXT_control_flow_attributes : require
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: RM and RN size the register block, whose
// loops must unroll to keep it in registers; ACT selects code in vkml_activation.glsl's switch,
// which SwiftShader otherwise runs case by case.
// vkml:frozen RM RN ACT
layout(constant_id = 1) const int RM = 4;      // output channels per invocation
layout(constant_id = 2) const int RN = 4;      // pixels per invocation
layout(constant_id = 3) const int ACT = 0;     // ACT_* (vkml_activation.glsl)

#ifdef CONV
layout(std430, set = 0, binding = 0) readonly buffer X { FSTORE_T x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { FSTORE_T w[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { FSTORE_T bias[]; };
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 isz;      // input D, H, W; input channels summed per group
    ivec4 osz;      // output D, H, W (of this dispatch); output channels per group
    ivec4 ksz;      // taps D, H, W; has bias
    ivec4 str;      // strides D, H, W; channel blocks per group
    ivec4 dil;      // dilations D, H, W (signed); output pixels (D*H*W)
    ivec4 pad;      // start padding D, H, W; first output element (y0)
    uvec4 xs;       // input element strides: image, channel, d, h
    uvec4 ws;       // filter element strides: output channel, summed channel, group; tap 0
    ivec4 wt;       // filter element steps per tap: d, h, w; -
    uvec4 ys;       // output element strides: image, channel, d, h
    uvec4 s2;       // element strides along w: input, output; bias channel stride; -
    vec4 act;       // activation parameters
};

void main() {
    int L = int(gl_WorkGroupSize.x);
    int p0 = int(gl_WorkGroupID.x) * L * RN + int(gl_LocalInvocationID.x);
    int g = int(gl_WorkGroupID.y) / str.w;
    int m0 = (int(gl_WorkGroupID.y) - g * str.w) * RM;
    uint n = gl_WorkGroupID.z;
    int cig = isz.w, cog = osz.w, npix = dil.w, ohw = osz.y * osz.z;

    ivec3 base[RN];                             // input position of each pixel at tap 0
    [[unroll]] for (int j = 0; j < RN; j++) {
        int p = p0 + j * L;
        int od = p / ohw, r = p - od * ohw;
        int oh = r / osz.z, ow = r - oh * osz.z;
        base[j] = p < npix ? ivec3(od, oh, ow) * str.xyz - pad.xyz : ivec3(-(1 << 30));
    }
    uint xg = n * xs.x + uint(g * cig) * xs.y;
    uint wrow[RM];
    [[unroll]] for (int i = 0; i < RM; i++)
        wrow[i] = uint(g) * ws.z + uint(min(m0 + i, cog - 1)) * ws.x + ws.w;

    float acc[RM][RN];
    [[unroll]] for (int i = 0; i < RM; i++)
        [[unroll]] for (int j = 0; j < RN; j++) acc[i][j] = 0.0;

    int taps = ksz.x * ksz.y * ksz.z;
    [[dont_unroll]] for (int t = 0; t < taps; t++) {
        int kd = t / (ksz.y * ksz.z), kr = t - kd * ksz.y * ksz.z;
        int kh = kr / ksz.z, kw = kr - kh * ksz.z;
        ivec3 off = ivec3(kd, kh, kw) * dil.xyz;
        uint wo = uint(kd * wt.x + kh * wt.y + kw * wt.z);
        uint xo[RN];
        float f[RN];
        [[unroll]] for (int j = 0; j < RN; j++) {
            ivec3 q = base[j] + off;
            bool in_ = all(greaterThanEqual(q, ivec3(0))) && all(lessThan(q, isz.xyz));
            xo[j] = in_ ? xg + uint(q.x) * xs.z + uint(q.y) * xs.w + uint(q.z) * s2.x : 0u;
            f[j] = in_ ? 1.0 : 0.0;
        }
        [[dont_unroll]] for (int ci = 0; ci < cig; ci++) {
            uint xc = uint(ci) * xs.y, wc = uint(ci) * ws.y + wo;
            float xv[RN], wv[RM];
            [[unroll]] for (int j = 0; j < RN; j++) xv[j] = FLOAD(x, xo[j] + xc) * f[j];
            [[unroll]] for (int i = 0; i < RM; i++) wv[i] = FLOAD(w, wrow[i] + wc);
            [[unroll]] for (int i = 0; i < RM; i++)
                [[unroll]] for (int j = 0; j < RN; j++) acc[i][j] = fma(wv[i], xv[j], acc[i][j]);
        }
    }

    uint yg = n * ys.x + uint(pad.w);
    [[unroll]] for (int j = 0; j < RN; j++) {
        int p = p0 + j * L;
        if (p >= npix) continue;
        int od = p / ohw, r = p - od * ohw;
        int oh = r / osz.z, ow = r - oh * osz.z;
        uint yp = yg + uint(od) * ys.z + uint(oh) * ys.w + uint(ow) * s2.y;
        [[unroll]] for (int i = 0; i < RM; i++) {
            int m = m0 + i;
            if (m >= cog) continue;
            int co = g * cog + m;
            float bv = ksz.w != 0 ? FLOAD(bias, uint(co) * s2.z) : 0.0;
            FSTORE(y, yp + uint(co) * ys.y, vkml_activation(ACT, acc[i][j] + bv, act));
        }
    }
}
#endif

#ifdef GEMM
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Push {
    ivec4 mnk;      // M, N, K, -
    ivec4 sa;       // A strides: batch, k, m; -
    ivec4 sb;       // B strides: batch, k, n; -
    ivec4 sc;       // C strides: batch, m, n; -
};

void main() {
    int L = int(gl_WorkGroupSize.x);
    int n0 = int(gl_WorkGroupID.x) * L * RN + int(gl_LocalInvocationID.x);
    int m0 = int(gl_WorkGroupID.y) * RM;
    int bt = int(gl_WorkGroupID.z);
    int bo[RN];
    [[unroll]] for (int j = 0; j < RN; j++)
        bo[j] = bt * sb.x + min(n0 + j * L, mnk.y - 1) * sb.z;
    int ao[RM];
    [[unroll]] for (int i = 0; i < RM; i++) ao[i] = bt * sa.x + min(m0 + i, mnk.x - 1) * sa.z;
    float acc[RM][RN];
    [[unroll]] for (int i = 0; i < RM; i++)
        [[unroll]] for (int j = 0; j < RN; j++) acc[i][j] = 0.0;
    [[dont_unroll]] for (int k = 0; k < mnk.z; k++) {
        float bv[RN], av[RM];
        [[unroll]] for (int j = 0; j < RN; j++) bv[j] = b[bo[j] + k * sb.y];
        [[unroll]] for (int i = 0; i < RM; i++) av[i] = a[ao[i] + k * sa.y];
        [[unroll]] for (int i = 0; i < RM; i++)
            [[unroll]] for (int j = 0; j < RN; j++) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    [[unroll]] for (int j = 0; j < RN; j++) {
        int nn = n0 + j * L;
        [[unroll]] for (int i = 0; i < RM; i++)
            if (nn < mnk.y && m0 + i < mnk.x)
                c[bt * sc.x + (m0 + i) * sc.y + nn * sc.z] = acc[i][j];
    }
}
#endif
