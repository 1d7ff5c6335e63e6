#version 450
// DML_PADDING_OPERATOR_DESC / DML_PADDING1_OPERATOR_DESC: moves elements by size, so one
// variant per element width serves every data type (float64 and int64 included).
//
// vkml:variant padding_e1 ELEM_BYTES=1
// vkml:variant padding_e2 ELEM_BYTES=2
// vkml:variant padding_e4 ELEM_BYTES=4
// vkml:variant padding_e8 ELEM_BYTES=8
// vkml:variant padding_e1_packed ELEM_BYTES=1 PACKED=1
// vkml:variant padding_e2_packed ELEM_BYTES=2 PACKED=1
//
// A dispatch covers one box (origin, extent) of output coordinates: the whole output, a
// border box when the copy engine copies the interior, or a window of a tensor too large
// to bind whole.  Each output coordinate c maps to input coordinate c - start by the mode.
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

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int RANK = 8;      // dimensions after merging (loops unroll)
// The padding mode is a specialization constant, not a parameter: lavapipe inlines
// uniform-buffer values that steer branches and rebuilds the shader on every dispatch,
// and the branches vanish for the mode at hand.
layout(constant_id = 2) const uint MODE = 0u;
// How many trailing dimensions the grid's x covers: more than one when the last is too
// short to fill a workgroup (a border box 2 elements wide, say).
layout(constant_id = 3) const int XDIMS = 1;

layout(std430, set = 0, binding = 0) readonly buffer In { ELEM x[]; };
layout(std430, set = 0, binding = 1) buffer Out { ELEM y[]; };
// Parameters live in a uniform buffer: drivers load uniform-offset UBO members once per
// subgroup (lavapipe scalarizes SSBO loads per lane even at uniform offsets).
layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 value_bits;             // .x: the constant's bits (packed variants)
    uvec4 in_size[2];             // per dimension, 4 to a uvec4
    uvec4 start[2];
    uvec4 in_stride[2];
    uvec4 out_stride[2];
};
layout(std430, set = 0, binding = 3) readonly buffer Value { ELEM value[]; };

// The box of output coordinates this dispatch writes.  Grid: x runs along the last XDIMS
// dimensions, y along the one before, z over the rest; so every index but x is the same
// for a whole workgroup and its arithmetic is done once, not per lane.
layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // element index of the first bound element
    uint x_count;                 // product of the extents the grid's x covers
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]
const uint CONSTANT = 0u, EDGE = 1u, REFLECTION = 2u, SYMMETRIC = 3u, WRAP = 4u;

// The input coordinate of an output coordinate outside the input, |oc - start| = dist
// away before (or past) its start: every step in 32-bit unsigned arithmetic, exact for
// any UINT size and padding (a signed difference would wrap past 2^31).
uint fold_index(bool before, uint dist, uint n) {
    if (MODE == EDGE) return before ? 0u : n - 1u;
    if (MODE == WRAP) { uint r = dist % n; return before ? (r == 0u ? 0u : n - r) : r; }
    if (MODE == REFLECTION) {     // -dist reflects onto dist; period 2 (n - 1)
        if (n == 1u) return 0u;   // a single element reflects onto itself (as numpy.pad)
        uint m = n - 1u;
        uint q = dist / m, r = dist - q * m;
        return (q & 1u) == 0u ? r : m - r;
    }
    uint t = before ? dist - 1u : dist;   // SYMMETRIC: -1 mirrors 0; period 2 n
    uint q = t / n, r = t - q * n;
    return (q & 1u) == 0u ? r : n - 1u - r;
}

uint out_off = 0u, in_off = 0u;
bool inside = true;

void visit(int d, uint oc) {
    out_off += oc * AT(out_stride, d);
    uint s = AT(start, d);
    uint n = AT(in_size, d);
    bool before = oc < s;
    uint dist = before ? s - oc : oc - s;
    uint c = dist;
    if (before || dist >= n) {
        if (MODE == CONSTANT) { inside = false; return; }
        c = fold_index(before, dist, n);
    }
    in_off += c * AT(in_stride, d);
}

void main() {
    uint gx = gl_GlobalInvocationID.x;
    if (gx >= x_count) return;
    const int YDIM = RANK - XDIMS - 1;            // the dimension y runs along, if any
    uint z = gl_GlobalInvocationID.z;
    for (int d = YDIM - 1; d >= 0; d--) {
        uint e = AT(extent, d);
        visit(d, AT(origin, d) + z % e);
        z /= e;
    }
    if (YDIM >= 0) visit(YDIM, AT(origin, YDIM) + gl_GlobalInvocationID.y);
    for (int d = RANK - 1; d > YDIM; d--) {
        uint e = AT(extent, d);
        visit(d, AT(origin, d) + gx % e);
        gx /= e;
    }
    uint o = out_off - out_base;
#ifdef PACKED
    uint v = inside ? (ELEM_BYTES == 2 ? VKML_LD16(x, in_off - in_base)
                                       : VKML_LD8(x, in_off - in_base))
                    : value_bits.x;
#if ELEM_BYTES == 2
    VKML_ST16(y, o, v)
#else
    VKML_ST8(y, o, v)
#endif
#else
    if (inside) y[o] = x[in_off - in_base]; else y[o] = value[0];
#endif
}
