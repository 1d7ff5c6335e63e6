#version 450
// The standalone activation operators (DML_ACTIVATION_*_OPERATOR_DESC and
// DML_ELEMENT_WISE_CLIP_OPERATOR_DESC): Y[i] = f(X[i]) for every element of the output
// box, each tensor with its own element strides (0 broadcasts an input).  f is the same
// vkml_activation() the fused kernels apply (glsl/include/vkml_activation.glsl), chosen
// by the specialization constant ACT (the switch folds away); arithmetic in float32 for
// float32 and float16 tensors (float16 stored as halves, or packed two to a 32-bit word
// on devices without 16-bit storage).
//
// vkml:variant activation_f32 F32=1
// vkml:variant activation_f16 F16=1
// vkml:variant activation_f16_packed F16_PACKED=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 1 to 8 dimensions
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 24) const int ACT = 0;      // ACT_* of vkml_activation.glsl

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per dimension, in elements
    uvec4 in_stride[2];
    vec4 p;                       // the activation's parameters (kernel_parameters())
};

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // element index of the first bound element
    uint x_count;                 // invocations along x
    uint pad_;
    uvec4 magic[2];               // ceil(2^32 / extent): see divide()
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

// a / extent[d] for a < 2^16 (the host keeps grid coordinates below it): the high word of
// a * ceil(2^32 / extent), exact there.
uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

const int LAST = RANK - 1;

void main() {
    uint gx = gl_GlobalInvocationID.x;
    const int YDIM = RANK - XDIMS - 1;
    if (gx >= x_count || (YDIM >= 0 && gl_GlobalInvocationID.y >= AT(extent, YDIM))) return;
    uint coord[8];
    uint z = gl_GlobalInvocationID.z;
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) coord[YDIM] = AT(origin, YDIM) + gl_GlobalInvocationID.y;
    [[unroll]] for (int d = LAST; d > YDIM; d--) {
        if (d == YDIM + 1) {          // the outermost x dimension: gx < its extent
            coord[d] = AT(origin, d) + gx;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
    uint src = 0u, dst = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        src += coord[d] * AT(in_stride, d);
        dst += coord[d] * AT(out_stride, d);
    }
    float v = FLOAD(x, src - in_base);
    FSTORE(y, dst - out_base, vkml_activation(ACT, v, p));
}
