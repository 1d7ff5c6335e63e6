#version 450
// The standalone activation operators (DML_ACTIVATION_*_OPERATOR_DESC and
// DML_ELEMENT_WISE_CLIP_OPERATOR_DESC): Y[i] = f(X[i]) for every element of the output
// box, each tensor with its own element strides (0 broadcasts an input).  f is the same
// vkml_activation() the fused kernels apply (glsl/include/vkml_activation.glsl), chosen
// by the specialization constant ACT (the switch folds away); arithmetic in float32 for
// float32 and float16 tensors (float16 stored as halves, or packed two to a 32-bit word
// on devices without 16-bit storage).
//
// Packed input and output of one layout (the host flattens them to one dimension): each
// invocation takes V (a multiple of 4) neighbouring elements, four at a time read as a vec4 (TEXEL4: an RGBA32F
// texel, lavapipe vectorizes texel reads; SSBO4: a vec4 storage-buffer load) and stored
// as one vec4 (VEC_STORE), or two half pairs for float16.  No early return: on lavapipe
// uniform loads after a divergent return become per-lane gathers (docs/DEVELOPING.md).
//
// vkml:variant activation_f32 F32=1
// vkml:variant activation_f32_texel4 F32=1 TEXEL4=1
// vkml:variant activation_f32_ssbo4 F32=1 SSBO4=1
// vkml:variant activation_f16 F16=1
// vkml:variant activation_f16_packed F16_PACKED=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

#if defined(SSBO4)
layout(std430, set = 0, binding = 0) readonly buffer In4 { vec4 x4[]; };
#define LOAD4(q) x4[q]
#define LOAD1(i) x4[(i) >> 2][(i) & 3u]
#elif defined(TEXEL4)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;     // RGBA32F: 4 elements a texel
#define LOAD4(q) texelFetch(Xt, int(q))
#define LOAD1(i) texelFetch(Xt, int((i) >> 2))[(i) & 3u]
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
#define LOAD1(i) FLOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };
#ifdef F32
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 1 to 8 dimensions
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 21) const uint V = 1u;      // elements of the last dimension per invocation
layout(constant_id = 22) const bool VEC_STORE = false;   // flat, V a multiple of 4: vec4 stores
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case.
// vkml:frozen ACT
// DirectML runs these operators in place (the output bound to an input's memory): the
// host decorates the bindings Aliased, so that no driver reorders a binding's loads past
// another's stores (vkml.runtime.spirv.alias).
// vkml:aliased
layout(constant_id = 24) const int ACT = 0;      // ACT_* of vkml_activation.glsl

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per dimension, in elements
    uvec4 in_stride[2];
    vec4 p;                       // the activation's parameters (kernel_parameters())
};

#define VKML_BOX_COORD
#include "vkml_box.glsl"

const int LAST = RANK - 1;

void main() {
    bool live = !box_outside();
    vec4 prm = p;
    box_coord();
    uint end = AT(origin, LAST) + AT(extent, LAST);
    uint count = live && coord[LAST] < end ? min(V, end - coord[LAST]) : 0u;
    uint src = 0u, dst = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        src += coord[d] * AT(in_stride, d);
        dst += coord[d] * AT(out_stride, d);
    }
    uint s = src - in_base, o = dst - out_base;
#if defined(SSBO4) || defined(TEXEL4)
    if (VEC_STORE && count == V) {    // flat: s and o multiples of 4 (the host's rule)
        [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
            vec4 v = LOAD4((s >> 2) + k);
            y4[(o >> 2) + k] = vec4(vkml_activation(ACT, v.x, prm), vkml_activation(ACT, v.y, prm),
                                    vkml_activation(ACT, v.z, prm), vkml_activation(ACT, v.w, prm));
        }
        return;
    }
#endif
    uint istep = AT(in_stride, LAST), ostep = AT(out_stride, LAST);
#if !defined(SSBO4) && !defined(TEXEL4)
    if (VEC_STORE && count == V) {    // float16 (or float32 read by element): pairs
        [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
            float r[4];
            [[unroll]] for (uint j = 0u; j < 4u; j++)
                r[j] = vkml_activation(ACT, LOAD1(s + 4u * k + j), prm);
#ifdef F32
            y4[(o >> 2) + k] = vec4(r[0], r[1], r[2], r[3]);
#else
            FSTORE2(y, o + 4u * k, r[0], r[1]);
            FSTORE2(y, o + 4u * k + 2u, r[2], r[3]);
#endif
        }
        return;
    }
#endif
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) FSTORE(y, o + j * ostep, vkml_activation(ACT, LOAD1(s + j * istep), prm));
    }
}
