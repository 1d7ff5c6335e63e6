#version 450
// Store-width probe (vkml/ops/store_width.py): each invocation writes R runs of 32 bytes
// at consecutive offsets of its own, as two float4 stores or (U64, int64 shaders) as one
// u64vec4.  Which of the two the device runs faster decides whether the kernels that
// can store eight float32 as one u64vec4 do: on lavapipe a storage-buffer store takes a
// turn per lane and, within it, a scalar store per component, so 64-bit components
// carry twice the bytes for the same cost; a GPU writes either form at its bandwidth.
//
// vkml:variant store_probe_vec4
// vkml:variant store_probe_u64 U64=1
#extension GL_EXT_control_flow_attributes : require
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int R = 4;       // 32-byte runs per invocation

#ifdef U64
layout(std430, set = 0, binding = 0) writeonly buffer Y { u64vec4 y[]; };
#else
layout(std430, set = 0, binding = 0) writeonly buffer Y { vec4 y[]; };
#endif
layout(push_constant) uniform Push {
    uint lanes;         // invocations that store
    float seed;         // (values depend on it: nothing is constant-folded)
};

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= lanes) return;
    [[unroll]] for (int r = 0; r < R; r++) {
        uint o = i * uint(R) + uint(r);
        float v = seed + float(o);
#ifdef U64
        uvec4 a = floatBitsToUint(vec4(v, v + 1.0, v + 2.0, v + 3.0));
        uvec4 b = floatBitsToUint(vec4(v + 4.0, v + 5.0, v + 6.0, v + 7.0));
        y[o] = vkml_u64x4(a, b);
#else
        y[2u * o] = vec4(v, v + 1.0, v + 2.0, v + 3.0);
        y[2u * o + 1u] = vec4(v + 4.0, v + 5.0, v + 6.0, v + 7.0);
#endif
    }
}
