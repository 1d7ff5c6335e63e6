#version 450
// Microkernel of `python -m bench`: the device's compute-shader copy bandwidth.
//
// vkml:variant bench_copy_ssbo
// vkml:variant bench_copy_texel TEXEL=1
//
// Two read paths, because drivers differ in which one is fast: storage-buffer uvec4 loads
// (what GPUs stream best) and uniform texel-buffer texelFetch of RGBA32UI texels (lavapipe
// vectorizes these and scalarizes SSBO loads).  Both store uvec4s to a storage buffer.
// Each invocation copies PER consecutive uvec4s with no per-load branch (measured on
// lavapipe: 2x faster than PER loads strided by the workgroup size, 2.5x faster than one
// uvec4 per invocation).  The grid's y steps by a push constant, never gl_NumWorkGroups.
layout(local_size_x_id = 0) in;
#define PER 4

#ifdef TEXEL
layout(set = 0, binding = 0) uniform usamplerBuffer x;
#define LOAD(i) texelFetch(x, int(i))
#else
layout(std430, set = 0, binding = 0) readonly buffer In { uvec4 x[]; };
#define LOAD(i) x[i]
#endif
layout(std430, set = 0, binding = 1) writeonly buffer Out { uvec4 y[]; };
layout(push_constant) uniform Push {
    uint count;         // uvec4s to copy in this dispatch
    uint row;           // invocations per grid row
};

void main() {
    uint base = (gl_WorkGroupID.y * row + gl_GlobalInvocationID.x) * PER;
    if (base + PER <= count) {
        uvec4 v[PER];
        for (int k = 0; k < PER; k++) v[k] = LOAD(base + uint(k));
        for (int k = 0; k < PER; k++) y[base + uint(k)] = v[k];
    } else {
        for (uint i = base; i < count; i++) y[i] = LOAD(i);
    }
}
