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
// vkml:variant unfold_e4_texel4 ELEM_BYTES=4 TEXEL4=1
//
// The grid runs over (N, C, blocks...); an invocation writes, for each of the K window
// positions, V neighbouring outputs of the last block dimension (uvec4 stores where
// aligned, VEC_STORE).  Along the last spatial dimension their inputs are a row of
// T = S*(V-1) + L*(W-1) + 1 neighbours per outer window position, read once (ROWS:
// T <= 32) -- with TEXEL4 (4-byte elements, unit last input stride) as aligned RGBA32UI
// texels shifted into place: lavapipe gathers a texel per lane in one instruction, a
// storage-buffer read is a scalar load per lane.
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_index.glsl"
#define VKML_WINDOW_DIMS 6
#include "vkml_window.glsl"

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

#ifdef TEXEL4
layout(set = 0, binding = 0) uniform usamplerBuffer Xt;
#else
layout(std430, set = 0, binding = 0) readonly buffer In { ELEM x[]; };
#endif
layout(std430, set = 0, binding = 1) buffer Out { ELEM y[]; };
#if ELEM_BYTES == 4
layout(std430, set = 0, binding = 1) buffer Out4 { uvec4 y4[]; };
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 2 + D: the box is (N, C x K, blocks...)
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 21) const uint V = 1u;      // outputs of the last dimension per invocation
layout(constant_id = 22) const bool VEC_STORE = false;   // V = 4 or 8 stored as uvec4s
// The grid's dimension 1 is the output row c * K + k (one window position an invocation:
// tensors bound in windows), not the channel c (all K).
layout(constant_id = 27) const bool PER_ROW = false;
const uint K = W0 * W1 * W2 * W3 * W4 * W5;


layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per box dimension (N, row, blocks...)
    uvec4 in_stride[2];           // per input dimension (N, C, spatial...)
    uvec4 in_size[2];             // spatial sizes
    ivec4 start[2];               // StartPadding
    uint in_texels;               // TEXEL4: 4-element texels bound
};

#define VKML_BOX_COORD
#include "vkml_box.glsl"

#ifdef TEXEL4
VKML_SHIFT4(uvec4)
#endif

// The value (as bits) of input element src, 0 where !ok.
#if ELEM_BYTES == 8
#define VALUE uvec2
#define VZERO uvec2(0u)
#else
#define VALUE uint
#define VZERO 0u
#endif
VALUE load(bool ok, uint src) {
#ifdef TEXEL4
    uint i = ok ? src : 0u;
    VALUE v = texelFetch(Xt, int(i >> 2))[i & 3u];
#elif defined(PACKED) && ELEM_BYTES == 2
    VALUE v = VKML_LD16(x, ok ? src : 0u);
#elif defined(PACKED)
    VALUE v = VKML_LD8(x, ok ? src : 0u);
#elif ELEM_BYTES == 8
    VALUE v = x[ok ? src : 0u];
#else
    VALUE v = uint(x[ok ? src : 0u]);     // 8/16-bit values converted: no 8/16-bit arithmetic
#endif
    return ok ? v : VZERO;
}

void store(uint o, VALUE v) {
#if defined(PACKED) && ELEM_BYTES == 2
    VKML_ST16(y, o, v)
#elif defined(PACKED)
    VKML_ST8(y, o, v)
#elif ELEM_BYTES == 8
    y[o] = v;
#else
    y[o] = ELEM(v);
#endif
}

const int D = RANK - 2;
const int LAST = RANK - 1;
const uint WL = D == 1 ? W0 : D == 2 ? W1 : D == 3 ? W2 : D == 4 ? W3 : D == 5 ? W4 : W5;
const uint SL = D == 1 ? S0 : D == 2 ? S1 : D == 3 ? S2 : D == 4 ? S3 : D == 5 ? S4 : S5;
const uint LL = D == 1 ? L0 : D == 2 ? L1 : D == 3 ? L2 : D == 4 ? L3 : D == 5 ? L4 : L5;
const uint KO = K / WL;               // window positions of the outer spatial dimensions
const uint T = SL * (V - 1u) + LL * (WL - 1u) + 1u;   // inputs of a window row
const bool ROWS = T <= 32u;
const uint TR = ROWS ? T : 1u;

VALUE row[32];

// The TR inputs of a window row from last coordinate i0 (0 in the padding, or where
// !row_ok: the outer coordinates are).
void load_row(bool row_ok, uint off, int i0) {
    uint size_l = AT(in_size, D - 1);
#ifdef TEXEL4
    int e0 = int(off) + i0;           // unit last input stride
    int q = e0 >> 2;
    uint sh = uint(e0) & 3u;
    int last = int(in_texels) - 1;
    uvec4 prev = texelFetch(Xt, clamp(q, 0, last));
    [[unroll]] for (uint t = 0u; t < (TR + 3u) / 4u; t++) {
        uvec4 next = texelFetch(Xt, clamp(q + int(t) + 1, 0, last));
        uvec4 r = shift4(prev, next, sh);
        bvec4 in_row = lessThan(uvec4(ivec4(i0 + int(4u * t)) + ivec4(0, 1, 2, 3)),
                                uvec4(size_l));
        r = row_ok ? mix(uvec4(0u), r, in_row) : uvec4(0u);
        row[4u * t] = r.x;
        if (4u * t + 1u < TR) row[4u * t + 1u] = r.y;
        if (4u * t + 2u < TR) row[4u * t + 2u] = r.z;
        if (4u * t + 3u < TR) row[4u * t + 3u] = r.w;
        prev = next;
    }
#else
    [[unroll]] for (uint t = 0u; t < TR; t++) {
        int i = i0 + int(t);
        row[t] = load(row_ok && uint(i) < size_l, off + uint(i) * AT(in_stride, LAST));
    }
#endif
}

// Window position (ko, kl): V outputs of row c * K + ko * WL + kl.
void emit(uint ko, uint kl, bool row_ok, uint off, int i0, uint out_off, uint count) {
    uint ostep = AT(out_stride, LAST);
    VALUE v[8];
    [[unroll]] for (uint j = 0u; j < V; j++) {
        uint t = SL * j + LL * kl;
        if (ROWS) {
            v[j] = row[t];
        } else {
            int i = i0 + int(t);
            v[j] = load(row_ok && uint(i) < AT(in_size, D - 1),
                        off + uint(i) * AT(in_stride, LAST));
        }
    }
    uint o = out_off + (ko * WL + kl) * AT(out_stride, 1);
#if ELEM_BYTES == 4 && !defined(PACKED)
    if (VEC_STORE && count == V) {    // V = 4 or 8, o a multiple of 4
        y4[o >> 2] = uvec4(v[0], v[1], v[2], v[3]);
        if (V == 8u) y4[(o >> 2) + 1u] = uvec4(v[4], v[5], v[6], v[7]);
        return;
    }
#endif
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) store(o + j * ostep, v[j]);
    }
}

void main() {
    if (box_outside()) return;
    box_coord();
    uint count = min(V, AT(origin, LAST) + AT(extent, LAST) - coord[LAST]);
    // box (N, C, blocks): output row c * K + k, out_stride[1] is one row's stride
    uint kk = 0u;                     // PER_ROW: the window position
    if (PER_ROW) {
        uint c = coord[1] / K;        // K is a constant: no division instruction
        kk = coord[1] - c * K;
        coord[1] = c;
    }
    uint out_off = coord[0] * AT(out_stride, 0) + coord[1] * K * AT(out_stride, 1);
    [[unroll]] for (int d = 2; d < RANK; d++) out_off += coord[d] * AT(out_stride, d);
    out_off -= out_base;
    uint base = coord[0] * AT(in_stride, 0) + coord[1] * AT(in_stride, 1) - in_base;
    int i0 = int(coord[LAST] * SL) - AT(start, D - 1);   // the last dimension's first input

    uint ko_first = PER_ROW ? kk / WL : 0u;
    for (uint ko = ko_first; ko < (PER_ROW ? ko_first + 1u : KO); ko++) {
        // the outer window position's input row (all but the last spatial dimension)
        uint rem = ko;
        uint off = base;
        bool row_ok = true;
        [[unroll]] for (int d = D - 2; d >= 0; d--) {
            uint k = rem % win(d);
            rem /= win(d);
            int i = int(coord[2 + d] * stride(d) + k * dil(d)) - AT(start, d);
            row_ok = row_ok && uint(i) < AT(in_size, d);
            off += uint(i) * AT(in_stride, 2 + d);
        }
        if (ROWS) load_row(row_ok, off, i0);
        if (PER_ROW) {
            emit(ko, kk - ko * WL, row_ok, off, i0, out_off, count);
        } else if (ROWS) {
            [[unroll]] for (uint kl = 0u; kl < WL; kl++) emit(ko, kl, row_ok, off, i0, out_off, count);
        } else {
            for (uint kl = 0u; kl < WL; kl++) emit(ko, kl, row_ok, off, i0, out_off, count);
        }
    }
}
