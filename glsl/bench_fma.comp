#version 450
// Microkernel of `python -m bench`: the device's float32 FMA throughput.
//
// Each invocation runs 8 independent vec4 fma() chains for ITERS iterations, so the loop
// is bound by FMA issue, not latency.  The chains are separate variables, not an array:
// SwiftShader keeps a loop-indexed array in memory (far slower there).  The multiplier and
// addend come from push constants (nothing to fold at compile time) and the sum is stored
// behind a bound the compiler cannot see through, so no chain is dead code.
// FLOPs per invocation: ITERS * 8 chains * 4 lanes * 2.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int ITERS = 64;

layout(std430, set = 0, binding = 0) writeonly buffer Out { vec4 y[]; };
layout(push_constant) uniform Push {
    float mul;          // close to 1: the chains neither overflow nor flush to zero
    float add;
    uint count;         // invocations that store (all of them; the compiler cannot know)
    uint row;           // invocations per grid row (gl_WorkGroupID.y steps by it)
};

#define STEP(a) a = fma(a, m, c)

void main() {
    uint i = gl_WorkGroupID.y * row + gl_GlobalInvocationID.x;
    vec4 m = vec4(mul), c = vec4(add);
    vec4 a0 = vec4(float(i & 255u) * 1e-3);
    vec4 a1 = a0 + 1.0, a2 = a0 + 2.0, a3 = a0 + 3.0, a4 = a0 + 4.0, a5 = a0 + 5.0,
         a6 = a0 + 6.0, a7 = a0 + 7.0;
    for (int it = 0; it < ITERS; it++) {
        STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5); STEP(a6); STEP(a7);
    }
    if (i < count) y[i & 65535u] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}
