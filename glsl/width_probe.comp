#version 450
// Concurrent-width probe (vkml/ops/concurrent_width.py): every workgroup does the same
// fixed work, FMA-dense as a GEMM's inner loop (each lane CHAINS independent vec4
// accumulators, ITERS steps each), so a grid the device runs at once takes about one
// workgroup's time and a grid past that takes longer.  The host times grids of 1, 2,
// 4, ... workgroups; where the time starts to grow is the device's concurrent width.
//
// vkml:variant width_probe
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int CHAINS = 8;  // independent accumulators a lane

layout(std430, set = 0, binding = 0) writeonly buffer Y { vec4 y[]; };
layout(push_constant) uniform Push {
    uint iters;         // steps each accumulator takes (well below lavapipe's 65535)
    float seed;         // (values depend on it: nothing is constant-folded)
};

void main() {
    vec4 a[CHAINS];
    [[unroll]] for (int k = 0; k < CHAINS; k++) a[k] = vec4(seed + float(k));
    vec4 m = vec4(0.999, 0.998, 0.997, 0.996) * seed;
    vec4 d = vec4(0.001) * seed;
    [[dont_unroll]] for (uint i = 0u; i < iters; i++)
        [[unroll]] for (int k = 0; k < CHAINS; k++) a[k] = fma(a[k], m, d);
    vec4 s = vec4(0.0);
    [[unroll]] for (int k = 0; k < CHAINS; k++) s += a[k];
    // a store no seed the host passes takes, but which the compiler cannot rule out: the
    // sums stay live and the buffer holds one workgroup's lanes whatever the grid
    if (s.x == -seed) y[gl_LocalInvocationID.x] = s;
}
