#version 450
// DML_UNFOLD_OPERATOR_DESC (im2col): output element (n, c * K + k, b) -- K window
// positions, k and the block b in row-major order over the spatial dimensions -- is the
// input element (n, c, i[0..D-1]) with
//     i[d] = b[d] * Strides[d] - StartPadding[d] + k[d] * Dilations[d],
// or zero where that falls in the padding.  Data movement only: one variant per element
// width moves every data type bit-exactly.
//
// vkml:variant unfold_e1 ELEM_BYTES=1
// vkml:variant unfold_e2 ELEM_BYTES=2
// vkml:variant unfold_e4 ELEM_BYTES=4
// vkml:variant unfold_e8 ELEM_BYTES=8
// vkml:variant unfold_e1_packed ELEM_BYTES=1 PACKED=1
// vkml:variant unfold_e2_packed ELEM_BYTES=2 PACKED=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_index.glsl"

#if ELEM_BYTES == 1 && !defined(PACKED)
#extension GL_EXT_shader_8bit_storage : require
#define ELEM uint8_t
#elif ELEM_BYTES == 2 && !defined(PACKED)
#extension GL_EXT_shader_16bit_storage : require
#define ELEM uint16_t
#elif ELEM_BYTES == 8
#define ELEM uvec2
#else
#define ELEM uint
#endif

layout(std430, set = 0, binding = 0) readonly buffer In { ELEM x[]; };
layout(std430, set = 0, binding = 1) buffer Out { ELEM y[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 2 + D: the box is (N, C x K, blocks...)
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 3) const uint W0 = 1u;
layout(constant_id = 4) const uint W1 = 1u;
layout(constant_id = 5) const uint W2 = 1u;
layout(constant_id = 6) const uint W3 = 1u;
layout(constant_id = 7) const uint W4 = 1u;
layout(constant_id = 8) const uint W5 = 1u;
layout(constant_id = 9) const uint S0 = 1u;
layout(constant_id = 10) const uint S1 = 1u;
layout(constant_id = 11) const uint S2 = 1u;
layout(constant_id = 12) const uint S3 = 1u;
layout(constant_id = 13) const uint S4 = 1u;
layout(constant_id = 14) const uint S5 = 1u;
layout(constant_id = 15) const uint L0 = 1u;     // dilations
layout(constant_id = 16) const uint L1 = 1u;
layout(constant_id = 17) const uint L2 = 1u;
layout(constant_id = 18) const uint L3 = 1u;
layout(constant_id = 19) const uint L4 = 1u;
layout(constant_id = 20) const uint L5 = 1u;
const uint K = W0 * W1 * W2 * W3 * W4 * W5;

uint win(int d) { return d == 0 ? W0 : d == 1 ? W1 : d == 2 ? W2 : d == 3 ? W3 : d == 4 ? W4 : W5; }
uint stride(int d) { return d == 0 ? S0 : d == 1 ? S1 : d == 2 ? S2 : d == 3 ? S3 : d == 4 ? S4 : S5; }
uint dil(int d) { return d == 0 ? L0 : d == 1 ? L1 : d == 2 ? L2 : d == 3 ? L3 : d == 4 ? L4 : L5; }

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per box dimension (N, row, blocks...)
    uvec4 in_stride[2];           // per input dimension (N, C, spatial...)
    uvec4 in_size[2];             // spatial sizes
    ivec4 start[2];               // StartPadding
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
// a * ceil(2^32 / extent), exact there.  lavapipe runs an integer division as one scalar
// division per lane; the multiply-high is a vector instruction.
uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

void main() {
    uint gx = gl_GlobalInvocationID.x;
    const int D = RANK - 2;
    const int YDIM = RANK - XDIMS - 1;
    const int LAST = RANK - 1;
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
        if (d == YDIM + 1) {
            coord[d] = AT(origin, d) + gx;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
    uint out_off = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) out_off += coord[d] * AT(out_stride, d);
    uint row = coord[1];
    uint c = row / K;                 // K is a constant: no division instruction
    uint rem = row - c * K;           // window position, row-major
    uint in_off = coord[0] * AT(in_stride, 0) + c * AT(in_stride, 1);
    bool ok = true;
    [[unroll]] for (int d = D - 1; d >= 0; d--) {
        uint k = rem % win(d);
        rem /= win(d);
        int i = int(coord[2 + d] * stride(d) + k * dil(d)) - AT(start, d);
        ok = ok && uint(i) < AT(in_size, d);
        in_off += uint(i) * AT(in_stride, 2 + d);
    }
    uint o = out_off - out_base;
    uint src = ok ? in_off - in_base : 0u;
#ifdef PACKED
#if ELEM_BYTES == 2
    uint v = ok ? VKML_LD16(x, src) : 0u;
    VKML_ST16(y, o, v)
#else
    uint v = ok ? VKML_LD8(x, src) : 0u;
    VKML_ST8(y, o, v)
#endif
#elif ELEM_BYTES == 8
    uvec2 v = x[src];
    y[o] = ok ? v : uvec2(0u);
#else
    uint v = uint(x[src]);            // 8/16-bit values converted: no 8/16-bit arithmetic
    y[o] = ELEM(ok ? v : 0u);
#endif
}
