#version 450
// DML_GEMM where op(A) and op(B) are both contiguous along K (A as stored, B transposed:
// the (N, K) weights of a fully connected layer, ONNX Gemm's transB = 1): every output
// is a dot product of two rows, each read as RGBA32F texels of 4 consecutive k.  An
// invocation computes an RM x CN block (RM and CN specialization constants, the host
// picks them by M: a one-row product takes RM = 1, so no invocation repeats another's
// row); per 4 k it fetches RM + CN texels for 4 * RM * CN FMAs.  Lanes run along N (a B
// row each) and share A's fetches, which are uniform across them.  Rows and columns past
// the end are clamped to the last, their results never stored; no shared memory, no
// barriers (lavapipe's coroutine barriers cost more than the reuse saves).  The host's
// rule: K a multiple of 4, every other stride and both operands 4-aligned, bound whole.
// Params and Push are gemm.comp's, so the host packs them the same way.
//
// vkml:variant gemm_dot_f32 F32=1
// vkml:variant gemm_dot_f32_ssbo F32=1 SSBO4=1
//
// SSBO4 reads A and B as vec4 storage buffers, for operands past the device's
// maxTexelBufferElements (SwiftShader's is 65536: a 512 x 1000 classifier's weights).
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

#ifdef SSBO4
layout(std430, set = 0, binding = 0) readonly buffer InA { vec4 a4[]; };
layout(std430, set = 0, binding = 1) readonly buffer InB { vec4 b4[]; };
#define FETCH_A(i) a4[i]
#define FETCH_B(i) b4[i]
#else
layout(set = 0, binding = 0) uniform samplerBuffer At;     // RGBA32F: 4 k a texel
layout(set = 0, binding = 1) uniform samplerBuffer Bt;
#define FETCH_A(i) texelFetch(At, int(i))
#define FETCH_B(i) texelFetch(Bt, int(i))
#endif
layout(std430, set = 0, binding = 2) readonly buffer InC { FSTORE_T c[]; };
layout(std430, set = 0, binding = 3) buffer Out { FSTORE_T y[]; };

layout(local_size_x_id = 0, local_size_y_id = 1) in;
layout(constant_id = 2) const bool HAS_C = false;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case; RM and CN size the block of
// accumulators (SwiftShader keeps an array sized by an unfrozen constant in memory, several
// times slower).
// vkml:frozen ACT RM CN
layout(constant_id = 3) const int ACT = 0;       // ACT_* of vkml_activation.glsl
layout(constant_id = 4) const int RM = 8;        // rows an invocation
layout(constant_id = 5) const int CN = 8;        // columns an invocation

layout(std140, set = 0, binding = 4) uniform Params {
    uvec4 a_stride;               // (batch, channel, m, k) in elements, op(A)'s
    uvec4 b_stride;               // (batch, channel, k, n), op(B)'s
    uvec4 c_stride;               // (batch, channel, m, n)
    uvec4 y_stride;
    vec4 act_params;              // the fused activation's (kernel_parameters())
    float alpha, beta;
    uint k_size;
};

layout(push_constant) uniform Push {
    uvec4 origin;                 // (batch, channel, m, n) of this dispatch's box
    uvec4 extent;
    uint a_base, b_base, c_base, y_base;   // element index of each binding's first element
};

void main() {
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint zc = gl_WorkGroupID.z % extent.y;
    uvec4 at = origin + uvec4(gl_WorkGroupID.z / extent.y, zc,
                              gl_WorkGroupID.y * gl_WorkGroupSize.y * uint(RM),
                              gl_WorkGroupID.x * gl_WorkGroupSize.x * uint(CN));
    uvec4 end = origin + extent;
    uvec4 sa = a_stride, sb = b_stride;
    uint abase = at.x * sa.x + at.y * sa.y - a_base;
    uint bbase = at.x * sb.x + at.y * sb.y - b_base;
    uint m0 = at.z + uint(RM) * ty, n0 = at.w + uint(CN) * tx;
    uint ra[RM], rb[CN];
    [[unroll]] for (int i = 0; i < RM; i++) ra[i] = (abase + min(m0 + i, end.z - 1u) * sa.z) >> 2;
    [[unroll]] for (int j = 0; j < CN; j++) rb[j] = (bbase + min(n0 + j, end.w - 1u) * sb.w) >> 2;
    float acc[RM * CN];
    [[unroll]] for (int e = 0; e < RM * CN; e++) acc[e] = 0.0;
    uint kq_end = k_size >> 2;
    for (uint kq = 0u; kq < kq_end; kq++) {
        vec4 bv[CN];
        [[unroll]] for (int j = 0; j < CN; j++) bv[j] = FETCH_B(rb[j] + kq);
        [[unroll]] for (int i = 0; i < RM; i++) {
            vec4 av = FETCH_A(ra[i] + kq);
            [[unroll]] for (int j = 0; j < CN; j++) acc[i * CN + j] += dot(av, bv[j]);
        }
    }
    float al = alpha, be = beta;
    vec4 prm = act_params;
    uvec4 sc = c_stride, sy = y_stride;
    uint cb = at.x * sc.x + at.y * sc.y - c_base;
    uint yb = at.x * sy.x + at.y * sy.y - y_base;
    [[unroll]] for (int i = 0; i < RM; i++) {
        uint m = m0 + i;
        [[unroll]] for (int j = 0; j < CN; j++) {
            uint n = n0 + j;
            if (m < end.z && n < end.w) {
                float v = al * acc[i * CN + j];
                if (HAS_C) v += be * FLOAD(c, cb + m * sc.z + n * sc.w);
                FSTORE(y, yb + m * sy.z + n * sy.w, vkml_activation(ACT, v, prm));
            }
        }
    }
}
