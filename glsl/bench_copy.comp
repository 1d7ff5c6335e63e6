#version 450
// Microkernel of `python -m bench`: the device's compute-shader copy bandwidth.
//
// vkml:variant bench_copy_ssbo
// vkml:variant bench_copy_texel TEXEL=1
// vkml:variant bench_copy_texel_u64 TEXEL=1 U64=1
//
// Two read paths, because drivers differ in which one is fast: storage-buffer uvec4 loads
// (what GPUs stream best) and uniform texel-buffer texelFetch of RGBA32UI texels (lavapipe
// vectorizes these and scalarizes SSBO loads).  Both store uvec4s to a storage buffer;
// U64 (devices with int64 shaders) stores pairs of them as one u64vec4 (lavapipe's store
// loop goes per component, not per byte: half the components, faster).
// Each invocation copies PER consecutive uvec4s with no per-load branch (on lavapipe
// faster than PER loads strided by the workgroup size, or one uvec4 per invocation).  The grid's y steps by a push constant, never gl_NumWorkGroups.
layout(local_size_x_id = 0) in;
#define PER 4

#ifdef TEXEL
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
layout(set = 0, binding = 0) uniform usamplerBuffer x;
#define LOAD(i) texelFetch(x, int(i))
#else
layout(std430, set = 0, binding = 0) readonly buffer In { uvec4 x[]; };
#define LOAD(i) x[i]
#endif
layout(std430, set = 0, binding = 1) writeonly buffer Out { uvec4 y[]; };
#ifdef U64
layout(std430, set = 0, binding = 1) writeonly buffer Out64 { u64vec4 y8[]; };
#endif
layout(push_constant) uniform Push {
    uint count;         // uvec4s to copy in this dispatch
    uint row;           // invocations per grid row
};

void main() {
    uint base = (gl_WorkGroupID.y * row + gl_GlobalInvocationID.x) * PER;
    if (base + PER <= count) {
        uvec4 v[PER];
        for (int k = 0; k < PER; k++) v[k] = LOAD(base + uint(k));
#ifdef U64
        for (int k = 0; k < PER; k += 2)
            y8[(base + uint(k)) >> 1] = vkml_u64x4(v[k], v[k + 1]);
#else
        for (int k = 0; k < PER; k++) y[base + uint(k)] = v[k];
#endif
    } else {
        for (uint i = base; i < count; i++) y[i] = LOAD(i);
    }
}
