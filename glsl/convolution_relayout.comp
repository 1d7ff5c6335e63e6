#version 450
// Convolution's re-layout pass: a float32 copy of (part of) a tensor in the layout a fast
// kernel reads, with zeros where the source has no element.  It makes the padded input
// planes of the implicit GEMM (zero borders: no bounds checks in the hot loop) and the
// re-laid filters ([group][block][row tap][channel][column tap][output channel], kernel
// flipped in the CONVOLUTION mode, output channels padded to the register block).
//
//   dst[sum_k c_k * dstride_k] = src[base + sum_k c_k * stride_k]  if lo_k <= c_k < hi_k
//                                                                  for every k, else 0
// over an 8-D box c (source strides may be negative: flipped axes).  Lanes run along the
// two innermost dimensions; each workgroup walks RPG consecutive rows of the next one,
// its other coordinates decomposed once (lavapipe pays microseconds per workgroup, and
// integer division per element costs more than the copy).
//
// vkml:variant convolution_relayout_f32 F32=1
// vkml:variant convolution_relayout_f16 F16=1
// vkml:variant convolution_relayout_f16_packed F16_PACKED=1
// vkml:variant convolution_relayout_texel TEXEL=1
//
// The TEXEL variant reads the source through a uniform texel buffer (R32F or R16F: the
// fetch returns float either way), which lavapipe vectorizes; the others read storage
// buffers (any size, any device).
#extension GL_EXT_control_flow_attributes : require
#ifdef TEXEL
#define F32 1
#endif
#include "vkml_float.glsl"

layout(local_size_x_id = 0) in;

#ifdef TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer src;
#define LOAD(i) texelFetch(src, int(i)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T src[]; };
#define LOAD(i) FLOAD(src, i)
#endif
layout(std430, set = 0, binding = 1) writeonly buffer Out { float dst[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Out4 { vec4 dst4[]; };
// V4: each invocation writes four consecutive elements of the innermost dimension as one
// float4 (its size, its destination row strides and the origin are multiples of 4):
// a quarter of the stores, which lavapipe issues one lane at a time.
layout(constant_id = 1) const bool V4 = false;
layout(std140, set = 0, binding = 2) uniform Params {
    ivec4 size[2];       // the box, 8 dimensions (outermost first)
    ivec4 stride[2];     // source element stride per dimension
    ivec4 lo[2];         // coordinates that have a source element: lo <= c < hi
    ivec4 hi[2];
    ivec4 dstride[2];    // destination element stride per dimension
    ivec4 base;          // source element of coordinate 0 (wraps below 0), RPG, row groups, -
};
layout(push_constant) uniform Push {
    uint src_base;       // element index of the first source element bound
    uint dst_base;       // element index in dst of the box's origin
    uint z0;             // first workgroup z of this dispatch
    uint x0;             // first lane along x of this dispatch (x split into dispatches
                         // of at most maxComputeWorkGroupCount workgroups)
};

#define AT(a, k) a[(k) >> 2][(k) & 3]

void main() {
    const int E = V4 ? 4 : 1;
    // Lanes over the two innermost dimensions flattened (one division per lane);
    // workgroup z -> dimensions 0..4 and a group of RPG rows along dimension 5, decomposed
    // once per workgroup.
    int inner = int(x0 + gl_GlobalInvocationID.x) * E;
    int s7 = AT(size, 7);
    if (inner >= AT(size, 6) * s7) return;
    int c7 = inner % s7;
    int c6 = inner / s7;
    int rpg = base.y;
    int z = int(z0 + gl_WorkGroupID.z);
    int r0 = (z % base.z) * rpg;
    z /= base.z;
    bool inside = c6 >= AT(lo, 6) && c6 < AT(hi, 6);
    int si = base.x + c6 * AT(stride, 6) + c7 * AT(stride, 7);
    int di = c6 * AT(dstride, 6) + c7 * AT(dstride, 7);
    [[unroll]] for (int k = 4; k >= 0; k--) {
        int s = AT(size, k);
        int ck = z % s;
        z /= s;
        inside = inside && ck >= AT(lo, k) && ck < AT(hi, k);
        si += ck * AT(stride, k);
        di += ck * AT(dstride, k);
    }
    bool in7[4];
    [[unroll]] for (int e = 0; e < E; e++) in7[e] = c7 + e >= AT(lo, 7) && c7 + e < AT(hi, 7);
    int r1 = min(r0 + rpg, AT(size, 5));
    si += r0 * AT(stride, 5);
    di += r0 * AT(dstride, 5);
    for (int r = r0; r < r1; r++) {
        bool row = inside && r >= AT(lo, 5) && r < AT(hi, 5);
        vec4 v = vec4(0.0);
        [[unroll]] for (int e = 0; e < E; e++) {
            if (row && in7[e]) v[e] = LOAD(uint(si + e * AT(stride, 7)) - src_base);
        }
        if (V4) dst4[(dst_base + uint(di)) >> 2] = v;
        else dst[dst_base + uint(di)] = v.x;
        si += AT(stride, 5);
        di += AT(dstride, 5);
    }
}
