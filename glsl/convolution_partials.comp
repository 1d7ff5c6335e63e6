#version 450
// The second pass of a split reduction (split-K, ops/convolution/gemm.py): the implicit
// GEMM's KS slices each stored their partial sums of an output element (float32, laid
// out as [image][slice][channel][pixel], pixels packed D x H x W); this pass adds them,
// adds the bias (and a graph's residual), applies the fused activation and stores
// through the output's DML strides (float32 / float16 / packed float16), as the GEMM's
// own output pass does without a split.
//
// Lanes run along an image's channel plane (x: pixel), a workgroup's channel and image
// come from its y and z (uniform per workgroup).
//
// vkml:variant convolution_partials_f32 F32=1
// vkml:variant convolution_partials_f16 F16=1
// vkml:variant convolution_partials_f16_packed F16_PACKED=1
// vkml:variant convolution_partials_f32_res F32=1 RES=1
// vkml:variant convolution_partials_f16_res F16=1 RES=1
// vkml:variant convolution_partials_f16_packed_res F16_PACKED=1 RES=1
//
// RES variants add a residual laid out as the output (y = act(sum + bias + R)), a
// variant of its own as in convolution_gemm.comp.
#extension GL_EXT_control_flow_attributes : require
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
// Frozen into the module by the host: ACT selects code in vkml_activation.glsl's switch,
// which SwiftShader otherwise runs case by case.
// vkml:frozen ACT
layout(constant_id = 1) const int ACT = 0;     // ACT_* (vkml_activation.glsl)
layout(constant_id = 2) const int KS = 2;      // slices of the reduction

layout(std430, set = 0, binding = 0) readonly buffer P { float part[]; };
layout(std430, set = 0, binding = 1) readonly buffer Bias { FSTORE_T bias[]; };
layout(std430, set = 0, binding = 2) buffer Y { FSTORE_T y[]; };
layout(std140, set = 0, binding = 3) uniform Params {
    uvec4 size;         // output D, H, W, pixels of a plane (D * H * W)
    uvec4 chans;        // output channels, has bias, bias stride, -
    uvec4 ys;           // Y element strides: image, channel, d, h
    uvec4 ys_w;         // Y element stride w, -, -, -
    vec4 act;           // activation parameters
};
#ifdef RES
layout(std430, set = 0, binding = 4) readonly buffer Res { FSTORE_T res[]; };
#define PLUS_RESID(i) + FLOAD(res, (i))
#else
#define PLUS_RESID(i)       // (nothing: x + 0.0 is no identity, -0 + 0 = +0)
#endif
layout(push_constant) uniform Push {
    uint c0;            // first channel of this dispatch (y splits past the grid limit)
    uint n0;            // first image of this dispatch
};

void main() {
    uint p = gl_GlobalInvocationID.x;
    if (p >= size.w) return;
    uint c = c0 + gl_WorkGroupID.y;
    uint n = n0 + gl_WorkGroupID.z;
    uint plane = chans.x * size.w;                   // a slice's elements of one image
    uint at = (n * uint(KS) * chans.x + c) * size.w + p;
    float s = 0.0;
    [[unroll]] for (int k = 0; k < KS; k++) s += part[at + uint(k) * plane];
    uint w = p % size.z;
    uint r = p / size.z;
    uint yo = n * ys.x + c * ys.y + (r / size.y) * ys.z + (r % size.y) * ys.w + w * ys_w.x;
    float b = chans.y != 0u ? FLOAD(bias, c * chans.z) : 0.0;
    FSTORE(y, yo, vkml_activation(ACT, s + b PLUS_RESID(yo), act));
}
