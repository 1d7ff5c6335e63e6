#version 450
// A 1x1 convolution of 1x1 planes -- a matrix-vector product per image, as in a
// squeeze-excitation block's two fully connected layers (after a global average pool):
// each group of KS lanes of a subgroup computes MB output channels, its lanes splitting
// the input channels (lane l sums channels l, l + KS, ...), then the lanes' sums meet by
// butterfly shuffles and lanes 0..MB-1 of the group add the bias, apply the fused
// activation and store one output each.  KS = 1 (few input channels): each lane sums
// all of them for its MB channels, no shuffles.
// The implicit GEMMs run such a shape with one pixel a block: the whole reduction in one
// lane per channel block, the other lanes of its subgroup idle (lavapipe runs them
// anyway), which made these layers cost ten times the dispatch floor.
// X4: input channels packed in both the input and the filter (and their image / output
// channel offsets multiples of 4) are fetched four at a time through RGBA32F views:
// lavapipe pays a texel fetch per lane whatever its width.
//
// vkml:variant convolution_gemv_f32 F32=1
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int MB = 4;      // output channels per subgroup (<= SG)
layout(constant_id = 2) const int SG = 8;      // subgroup size (the pipeline requires it)
// Frozen into the module by the host (vkml.runtime.spirv), as in the other convolution
// kernels: SwiftShader otherwise runs vkml_activation.glsl's switch case by case.
// KS sizes the unrolled butterfly.
// vkml:frozen ACT KS X4
layout(constant_id = 3) const int ACT = 0;     // ACT_* (vkml_activation.glsl)
layout(constant_id = 4) const int KS = 8;      // lanes splitting one block's input channels
                                               // (a power of two dividing SG)
layout(constant_id = 5) const bool X4 = false; // channels fetched four at a time (RGBA32F)

layout(set = 0, binding = 0) uniform samplerBuffer X;       // R32F
layout(set = 0, binding = 1) uniform samplerBuffer Wt;      // R32F, the filter in place
layout(std430, set = 0, binding = 2) readonly buffer Bias { FSTORE_T bias[]; };
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 size;         // input channels, output channels, has bias, bias stride
    ivec4 xs;           // X element strides: image, channel; -, -
    ivec4 ws;           // filter element strides: output channel, input channel; -, -
    uvec4 ys;           // Y element strides: image, channel; -, -
    vec4 act;           // activation parameters
};
layout(push_constant) uniform Push {
    int n0;             // first image of this dispatch
};

void main() {
    int sub = int(gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID);
    int lane = int(gl_SubgroupInvocationID) % KS;
    int n = n0 + int(gl_WorkGroupID.z);
    int o0 = (sub * (SG / KS) + int(gl_SubgroupInvocationID) / KS) * MB;
    // every lane of the subgroup takes part in the shuffles: a group past the last
    // channel computes a copy of the last block and stores nothing
    bool live = o0 < size.y;
    o0 = min(o0, (size.y - 1) / MB * MB);
    int wo[MB];
    float acc[MB];
    [[unroll]] for (int m = 0; m < MB; m++) {
        wo[m] = min(o0 + m, size.y - 1) * ws.x;    // (clamped: never stored)
        acc[m] = 0.0;
    }
    int xo = n * xs.x;
    if (X4) {           // (xs.y = ws.y = 1; xo, wo[m] and size.x multiples of 4)
        [[dont_unroll]] for (int k = lane; k < size.x / 4; k += KS) {
            vec4 xv = texelFetch(X, (xo >> 2) + k);
            [[unroll]] for (int m = 0; m < MB; m++) {
                vec4 wv = texelFetch(Wt, (wo[m] >> 2) + k);
                [[unroll]] for (int q = 0; q < 4; q++) acc[m] = fma(wv[q], xv[q], acc[m]);
            }
        }
    } else {
        [[dont_unroll]] for (int k = lane; k < size.x; k += KS) {
            float xv = texelFetch(X, xo + k * xs.y).x;
            [[unroll]] for (int m = 0; m < MB; m++)
                acc[m] = fma(texelFetch(Wt, wo[m] + k * ws.y).x, xv, acc[m]);
        }
    }
    [[unroll]] for (int d = KS / 2; d >= 1; d >>= 1)
        [[unroll]] for (int m = 0; m < MB; m++)
            acc[m] += subgroupShuffleXor(acc[m], uint(d));
    if (!live) return;
    // KS > 1: lane m of the group stores channel o0 + m (constant indices: acc stays in
    // registers); KS = 1: the lane stores its MB channels
    const int STORES = KS >= MB ? 1 : MB;
    [[unroll]] for (int i = 0; i < STORES; i++) {
        int m = KS >= MB ? lane : i;
        float v = acc[0];
        [[unroll]] for (int j = 1; j < MB; j++)
            v = m == j ? acc[j] : v;
        int o = o0 + m;
        if (m < MB && o < size.y) {
            float b = size.z != 0 ? FLOAD(bias, uint(o * size.w)) : 0.0;
            FSTORE(y, uint(n) * ys.x + uint(o) * ys.y, vkml_activation(ACT, v + b, act));
        }
    }
}
