#version 450
// A squeeze-excitation block's head in one dispatch: the global average pool of the
// input's planes, then the two fully connected layers (1x1 convolutions of 1x1 planes)
// with their fused activations, into the per-channel scale the block multiplies its
// input by.  Apart, these are three dispatches of almost no work each: on a CPU driver
// each costs a dispatch's own floor, several times the work (a graph's "squeeze
// excitation" fusion, vkml/ops/squeeze_excitation.py).
//
// Workgroups (x: G pooling groups, z: images):
// 1. group g's lane l sums channels g x CG + l, + L, ... (L = LOCAL_SIZE_X, CG channels a
//    group) over their planes in plane order and stores sum / count in MEANS; X4: through
//    RGBA32F texels, four elements a fetch, the texels at a plane's ends masked to its
//    elements (a 7x7 plane: 13 fetches, not 49);
// 2. each group then counts itself done in COUNT (after its means are visible); the last
//    of an image's G groups goes on alone, the others end: one dispatch, no second pass
//    to wait for the pools.  The last one resets the count for the next execution;
// 3. lane l computes squeezed channel l, l + L, ... in input-channel order (W4A: a filter
//    row's four channels a fetch), adds the bias, applies ACT1;
// 4. every lane holds all the squeezed channels, then computes output channel l, l + L,
//    ... from them (W4B likewise), adds the bias, applies ACT2.
// The layers' inputs are the same for every lane: a lane of each subgroup loads a piece
// and shuffles it to the others (a CPU driver loads a lane's value from memory one lane
// at a time, a shuffle moves it in a register), so every loop runs to the same count in
// every lane (outputs clamped, stores masked).  lavapipe runs a workgroup on one
// thread: the pools are spread over G groups, the layers, a few thousand products, run
// on one; their cost is the filters' fetches.
//
// vkml:variant squeeze_excitation_f32 F32=1
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
// Frozen into the module by the host (vkml.runtime.spirv), as in the convolution kernels:
// SwiftShader otherwise runs vkml_activation.glsl's switch case by case; the unrolled
// loops follow C1 and SG.
// vkml:frozen ACT1 ACT2 X4 W4A W4B C1 SG
layout(constant_id = 1) const int ACT1 = 0;    // ACT_* of the squeezing layer
layout(constant_id = 2) const int ACT2 = 0;    // ACT_* of the exciting layer
layout(constant_id = 3) const bool X4 = false; // the input read as RGBA32F texels
layout(constant_id = 4) const int C = 1;       // input (and output) channels
layout(constant_id = 5) const int C1 = 1;      // squeezed channels
layout(constant_id = 6) const bool W4A = false;// W1's rows as RGBA32F texels (C % 4 = 0)
layout(constant_id = 7) const bool W4B = false;// W2's rows as RGBA32F texels (C1 % 4 = 0)
layout(constant_id = 8) const int SG = 8;      // subgroup size (full subgroups)

layout(set = 0, binding = 0) uniform samplerBuffer X;       // R32F (RGBA32F with X4)
layout(set = 0, binding = 1) uniform samplerBuffer W1;      // R32F (RGBA32F with W4A)
layout(std430, set = 0, binding = 2) readonly buffer Bias1 { float b1[]; };
layout(set = 0, binding = 3) uniform samplerBuffer W2;      // R32F (RGBA32F with W4B)
layout(std430, set = 0, binding = 4) readonly buffer Bias2 { float b2[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Y { float y[]; };
layout(std140, set = 0, binding = 6) uniform Params {
    ivec4 size;         // plane elements, output channels, has bias 1, has bias 2
    ivec4 pool;         // G pooling groups an image, CG channels a group, -, -
    ivec4 xs;           // X element strides: image, channel; bias strides 1, 2
    ivec4 ws;           // W1 strides: squeezed, input channel; W2: output, squeezed channel
    ivec4 ys;           // Y element strides: image, channel; -, -
    vec4 act1;          // ACT1's parameters
    vec4 act2;          // ACT2's parameters
};
// An image's means, four channels a vec4 (CP = C rounded up to 4 an image)
layout(std430, set = 0, binding = 7) coherent buffer Means { vec4 means[]; };
layout(std430, set = 0, binding = 8) coherent buffer Count { uint count[]; };   // an image's
layout(push_constant) uniform Push {
    int n0;             // first image of this dispatch
};

const int CP = (C + 3) / 4 * 4;
const int PIECES = (C1 + SG - 1) / SG;          // squeezed channels a lane loads
shared float hidden[PIECES * SG];
shared bool last;

void main() {
    const int L = int(gl_WorkGroupSize.x);
    int l = int(gl_LocalInvocationID.x);
    int s = int(gl_SubgroupInvocationID);
    int n = n0 + int(gl_WorkGroupID.z);
    int plane = size.x;
    int mbase = n * (CP / 4);
    int c0 = int(gl_WorkGroupID.x) * pool.y, c1 = min(C, c0 + pool.y);
    for (int c = c0 + l; c < c1; c += L) {
        int base = n * xs.x + c * xs.y;
        float sum = 0.0;
        if (X4) {       // (texels t covering [base, base + plane), the ends masked)
            for (int t = base >> 2; t <= (base + plane - 1) >> 2; t++) {
                vec4 v = texelFetch(X, t);
                [[unroll]] for (int q = 0; q < 4; q++) {
                    int e = 4 * t + q;
                    sum += (e >= base && e < base + plane) ? v[q] : 0.0;
                }
            }
        } else {
            for (int e = 0; e < plane; e++)
                sum += texelFetch(X, base + e).x;
        }
        means[mbase + (c >> 2)][c & 3] = sum / float(plane);
    }
    memoryBarrierBuffer();      // (this group's means visible before it counts itself)
    barrier();
    if (l == 0)
        last = atomicAdd(count[n], 1u) == uint(pool.x - 1);
    barrier();
    if (!last)
        return;
    memoryBarrierBuffer();
    if (l == 0)
        count[n] = 0u;          // (for the next execution: every group has counted)

    // 3. the squeezing layer: the means four channels a vec4, SG vec4s a turn, vec4 u of
    //    a turn loaded by lane u and shuffled to the others
    for (int o0 = 0; o0 < C1; o0 += L) {
        int o = min(o0 + l, C1 - 1);
        float a = 0.0;
        for (int k0 = 0; k0 < CP / 4; k0 += SG) {
            vec4 mine = means[mbase + min(k0 + s, CP / 4 - 1)];
            [[unroll]] for (int u = 0; u < SG; u++) {
                int k = 4 * (k0 + u);   // (past C: the clamped vec4, its weights zero)
                vec4 m = subgroupShuffle(mine, uint(u));
                if (W4A) {      // (ws.y = 1, ws.x and C multiples of 4)
                    vec4 w = texelFetch(W1, (o * ws.x >> 2) + min(k, C - 4) / 4);
                    [[unroll]] for (int q = 0; q < 4; q++)
                        a = k < C ? fma(w[q], m[q], a) : a;
                } else {
                    [[unroll]] for (int q = 0; q < 4; q++) {
                        float w = texelFetch(W1, o * ws.x + min(k + q, C - 1) * ws.y).x;
                        a = k + q < C ? fma(w, m[q], a) : a;
                    }
                }
            }
        }
        float b = b1[o * xs.z];     // (no bias: the parameter block, xs.z = 0)
        float h = vkml_activation(ACT1, size.z != 0 ? a + b : a, act1);
        if (o0 + l < C1)
            hidden[o] = h;
    }
    barrier();

    // 4. the exciting layer: every squeezed channel in every lane's registers
    float piece[PIECES];
    [[unroll]] for (int p = 0; p < PIECES; p++)
        piece[p] = hidden[min(p * SG + s, C1 - 1)];
    float hid[C1];
    [[unroll]] for (int k = 0; k < C1; k++)
        hid[k] = subgroupShuffle(piece[k / SG], uint(k % SG));
    for (int o0 = 0; o0 < size.y; o0 += L) {
        int o = min(o0 + l, size.y - 1);
        float a = 0.0;
        if (W4B) {      // (ws.w = 1, ws.z and C1 multiples of 4)
            [[unroll]] for (int t = 0; t < C1 / 4; t++) {
                vec4 w = texelFetch(W2, (o * ws.z >> 2) + t);
                [[unroll]] for (int q = 0; q < 4; q++) a = fma(w[q], hid[4 * t + q], a);
            }
        } else {
            [[unroll]] for (int k = 0; k < C1; k++)
                a = fma(texelFetch(W2, o * ws.z + k * ws.w).x, hid[k], a);
        }
        float b = b2[o * xs.w];
        float v = vkml_activation(ACT2, size.w != 0 ? a + b : a, act2);
        if (o0 + l < size.y)
            y[n * ys.x + o * ys.y] = v;
    }
}
