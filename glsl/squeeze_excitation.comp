#version 450
// A squeeze-excitation block's head in one dispatch, one workgroup an image: the global
// average pool of the input's planes, then the two fully connected layers (1x1
// convolutions of 1x1 planes) with their fused activations, into the per-channel scale
// the block multiplies its input by.  Apart, these are three dispatches of almost no work
// each: on a CPU driver each costs a dispatch's own floor, several times the work (a
// graph's "squeeze excitation" fusion, vkml/ops/squeeze_excitation.py).
//
// 1. lane l sums channels l, l + L, ... (L = LOCAL_SIZE_X) over their planes in plane
//    order and keeps sum / count; X4: through RGBA32F texels, four elements a fetch, the
//    texels at a plane's ends masked to its elements (a 7x7 plane: 13 fetches, not 49);
// 2. after a barrier, lane l computes squeezed channels l, l + L, ... from the means in
//    input-channel order (W4A: a filter row's four channels a fetch), adds the bias,
//    applies ACT1;
// 3. after a barrier, likewise the output channels from the squeezed ones (W4B), ACT2.
// The means and the squeezed channels stay in shared memory (C + C1 floats).  lavapipe
// runs the workgroup on one thread, so its cost is the fetches: a texel fetch costs a
// lane's turn whatever its width.
//
// vkml:variant squeeze_excitation_f32 F32=1
#extension GL_EXT_control_flow_attributes : require
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
// Frozen into the module by the host (vkml.runtime.spirv), as in the convolution kernels:
// SwiftShader otherwise runs vkml_activation.glsl's switch case by case.
// vkml:frozen ACT1 ACT2 X4 W4A W4B
layout(constant_id = 1) const int ACT1 = 0;    // ACT_* of the squeezing layer
layout(constant_id = 2) const int ACT2 = 0;    // ACT_* of the exciting layer
layout(constant_id = 3) const bool X4 = false; // the input read as RGBA32F texels
layout(constant_id = 4) const int C = 1;       // input (and output) channels
layout(constant_id = 5) const int C1 = 1;      // squeezed channels
layout(constant_id = 6) const bool W4A = false;// W1's rows as RGBA32F texels (C % 4 = 0)
layout(constant_id = 7) const bool W4B = false;// W2's rows as RGBA32F texels (C1 % 4 = 0)

layout(set = 0, binding = 0) uniform samplerBuffer X;       // R32F (RGBA32F with X4)
layout(set = 0, binding = 1) uniform samplerBuffer W1;      // R32F (RGBA32F with W4A)
layout(std430, set = 0, binding = 2) readonly buffer Bias1 { float b1[]; };
layout(set = 0, binding = 3) uniform samplerBuffer W2;      // R32F (RGBA32F with W4B)
layout(std430, set = 0, binding = 4) readonly buffer Bias2 { float b2[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Y { float y[]; };
layout(std140, set = 0, binding = 6) uniform Params {
    ivec4 size;         // plane elements, output channels, has bias 1, has bias 2
    ivec4 xs;           // X element strides: image, channel; bias strides 1, 2
    ivec4 ws;           // W1 strides: squeezed, input channel; W2: output, squeezed channel
    ivec4 ys;           // Y element strides: image, channel; -, -
    vec4 act1;          // ACT1's parameters
    vec4 act2;          // ACT2's parameters
};
layout(push_constant) uniform Push {
    int n0;             // first image of this dispatch
};

shared float mean[C];
shared float hidden[C1];

void main() {
    const int L = int(gl_WorkGroupSize.x);
    int l = int(gl_LocalInvocationID.x);
    int n = n0 + int(gl_WorkGroupID.z);
    int plane = size.x;
    for (int c = l; c < C; c += L) {
        int base = n * xs.x + c * xs.y;
        float s = 0.0;
        if (X4) {       // (texels t covering [base, base + plane), the ends masked)
            for (int t = base >> 2; t <= (base + plane - 1) >> 2; t++) {
                vec4 v = texelFetch(X, t);
                [[unroll]] for (int q = 0; q < 4; q++) {
                    int e = 4 * t + q;
                    s += (e >= base && e < base + plane) ? v[q] : 0.0;
                }
            }
        } else {
            for (int e = 0; e < plane; e++)
                s += texelFetch(X, base + e).x;
        }
        mean[c] = s / float(plane);
    }
    barrier();
    for (int o = l; o < C1; o += L) {
        float a = 0.0;
        if (W4A) {      // (ws.y = 1, ws.x and C multiples of 4)
            for (int t = 0; t < C / 4; t++) {
                vec4 w = texelFetch(W1, (o * ws.x >> 2) + t);
                [[unroll]] for (int q = 0; q < 4; q++) a = fma(w[q], mean[4 * t + q], a);
            }
        } else {
            for (int k = 0; k < C; k++)
                a = fma(texelFetch(W1, o * ws.x + k * ws.y).x, mean[k], a);
        }
        if (size.z != 0)
            a += b1[o * xs.z];
        hidden[o] = vkml_activation(ACT1, a, act1);
    }
    barrier();
    for (int o = l; o < size.y; o += L) {
        float a = 0.0;
        if (W4B) {      // (ws.w = 1, ws.z and C1 multiples of 4)
            for (int t = 0; t < C1 / 4; t++) {
                vec4 w = texelFetch(W2, (o * ws.z >> 2) + t);
                [[unroll]] for (int q = 0; q < 4; q++) a = fma(w[q], hidden[4 * t + q], a);
            }
        } else {
            for (int k = 0; k < C1; k++)
                a = fma(texelFetch(W2, o * ws.z + k * ws.w).x, hidden[k], a);
        }
        if (size.w != 0)
            a += b2[o * xs.w];
        y[n * ys.x + o * ys.y] = vkml_activation(ACT2, a, act2);
    }
}
