#version 450
// Microkernel of `python -m bench`: the device's float32 FMA throughput.
//
// Each invocation runs CHAINS independent vec4 fma() chains for ITERS iterations, so the
// loop is bound by FMA issue, not latency.  The multiplier and addend come from push
// constants (nothing to fold at compile time) and the sum is stored behind a bound the
// compiler cannot see through, so no chain is dead code.
// FLOPs per invocation: ITERS * CHAINS * 4 lanes * 2.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int ITERS = 256;
#define CHAINS 8

layout(std430, set = 0, binding = 0) writeonly buffer Out { vec4 y[]; };
layout(push_constant) uniform Push {
    float mul;          // close to 1: the chains neither overflow nor flush to zero
    float add;
    uint count;         // invocations that store (all of them; the compiler cannot know)
    uint row;           // invocations per grid row (gl_WorkGroupID.y steps by it)
};

void main() {
    uint i = gl_WorkGroupID.y * row + gl_GlobalInvocationID.x;
    vec4 m = vec4(mul), c = vec4(add);
    vec4 a[CHAINS];
    for (int k = 0; k < CHAINS; k++) a[k] = vec4(float(i & 255u) * 1e-3 + float(k));
    for (int it = 0; it < ITERS; it++) {
        for (int k = 0; k < CHAINS; k++) a[k] = fma(a[k], m, c);
    }
    vec4 s = vec4(0.0);
    for (int k = 0; k < CHAINS; k++) s += a[k];
    if (i < count) y[i & 65535u] = s;
}
