#version 450
// DML_MAX_POOLING(1,2)_OPERATOR_DESC (without OutputIndicesTensor) and
// DML_AVERAGE_POOLING(1)_OPERATOR_DESC, as glsl/pooling.comp computes them (its header
// states the rules), for windows whose row segment fits registers: an invocation computes
// V neighbouring outputs of the last dimension; along it their windows cover
//     T = S*(V-1) + L*(W-1) + 1   neighbouring inputs per window row,
// each read once into `row` and reused by the V outputs (T <= 32: the host picks V).  The
// window geometry is specialization constants, so the window row and the V outputs unroll
// (lavapipe and SwiftShader unroll only what is constant) and the index arithmetic folds.
//   MODE 0 (max): padded cells are the lowest value (they never win; a window wholly in
//          the padding gives it); a NaN beats every number (EGT).
//   MODE 1 (average, float types): the float32 sum of the cells inside the input divided
//          by `divisor` (INCLUDE_PADDING) or their count (0 when there are none).
//
// vkml:variant pooling_rows_f32 F32=1
// vkml:variant pooling_rows_f32_texel F32=1 TEXEL=1
// vkml:variant pooling_rows_f16 F16=1
// vkml:variant pooling_rows_f16_packed F16_PACKED=1
// vkml:variant pooling_rows_i8 INT_BITS=8 SIGNED=1
// vkml:variant pooling_rows_u8 INT_BITS=8
// vkml:variant pooling_rows_i16 INT_BITS=16 SIGNED=1
// vkml:variant pooling_rows_u16 INT_BITS=16
// vkml:variant pooling_rows_i32 INT_BITS=32 SIGNED=1
// vkml:variant pooling_rows_u32 INT_BITS=32
// vkml:variant pooling_rows_i64 INT64=1 SIGNED=1
// vkml:variant pooling_rows_u64 INT64=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_elem.glsl"
#define VKML_WINDOW_DIMS 3
#include "vkml_window.glsl"

#ifdef TEXEL
// float32 through an R32F uniform texel buffer: lavapipe vectorizes texel reads and
// runs storage-buffer reads one lane at a time (docs/DEVELOPING.md)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define XLOAD(i) texelFetch(Xt, int(i)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer In { E_T x[]; };
#define XLOAD(i) ELOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { E_T y[]; };
#ifdef F32
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#endif
layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension
    uvec4 in_size;                // spatial sizes
    ivec4 start;                  // StartPadding (after safe_geometry)
    float divisor;                // INCLUDE_PADDING: the window's element count
};

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 or 5: N, C, 2 or 3 spatial
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 21) const uint V = 1u;      // outputs of the last dimension per invocation
layout(constant_id = 22) const bool VEC_STORE = false;   // float32, V = 4 or 8 as vec4s
layout(constant_id = 24) const int MODE = 0;              // 0 max, 1 average
layout(constant_id = 25) const bool INCLUDE_PADDING = false;
layout(constant_id = 26) const bool UNROLL_ROWS = false;  // few window rows: unrolled too

#define VKML_BOX_COORD
#include "vkml_box.glsl"
const int D = RANK - 2;
const int LAST = RANK - 1;
const uint WL = RANK == 4 ? W1 : W2;  // the last spatial dimension's window,
const uint SL = RANK == 4 ? S1 : S2;  // stride
const uint LL = RANK == 4 ? L1 : L2;  // and dilation
const uint KO = W0 * W1 * W2 / WL;    // window rows: positions of the outer dimensions
const uint T = SL * (V - 1u) + LL * (WL - 1u) + 1u;   // inputs of a window row
const uint TR = T <= 32u ? T : 32u;   // the host keeps T <= 32; this bounds the arrays

uint base;
VAL best[8];
float sum[8], cnt[8];
VAL row[32];
float row_in[32];      // 1 where the row's input lies inside the input (average's count)

// Offset of window row `ko` of this invocation (all but the last spatial dimension), or
// false where it lies in the padding.
bool outer_row(uint ko, out uint off) {
    uint rem = ko;
    off = base;
    bool ok = true;
    [[unroll]] for (int d = D - 2; d >= 0; d--) {
        uint k = rem % win(d);
        rem /= win(d);
        int i = int(coord[2 + d] * stride(d) + k * dil(d)) - start[d];
        ok = ok && uint(i) < in_size[d];
        off += uint(i) * AT(in_stride, 2 + d);
    }
    return ok;
}

// Window row `ko`: its T inputs read once, then every window position of the V outputs
// (`used`: the inputs of the outputs inside the box; past them the input binding may end).
void window_row(uint ko, uint used) {
    uint off;
    bool row_ok = outer_row(ko, off);
    int i0 = int(coord[LAST] * SL) - start[D - 1];
    [[unroll]] for (uint t = 0u; t < TR; t++) {
        int i = i0 + int(t);
        bool ok = row_ok && uint(i) < in_size[D - 1] && t < used;
        VAL v = XLOAD(ok ? off + uint(i) * AT(in_stride, LAST) : 0u);
        row[t] = ok ? v : (MODE == 0 ? ELOWEST : EZERO);
        row_in[t] = ok ? 1.0 : 0.0;
    }
    [[unroll]] for (uint kl = 0u; kl < WL; kl++) {
        [[unroll]] for (uint j = 0u; j < V; j++) {
            VAL v = row[SL * j + LL * kl];
            if (MODE == 0) best[j] = EGT(v, best[j]) ? v : best[j];
#ifdef E_FLOAT
            if (MODE == 1) {
                sum[j] += v;
                cnt[j] += row_in[SL * j + LL * kl];
            }
#endif
        }
    }
}

void main() {
    if (box_outside()) return;
    box_coord();
    uint count = min(V, AT(origin, LAST) + AT(extent, LAST) - coord[LAST]);
    base = coord[0] * in_stride[0].x + coord[1] * in_stride[0].y - in_base;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        best[j] = ELOWEST;
        sum[j] = 0.0;
        cnt[j] = 0.0;
    }
    uint used = SL * (count - 1u) + LL * (WL - 1u) + 1u;
    if (UNROLL_ROWS) {
        [[unroll]] for (uint ko = 0u; ko < KO; ko++) window_row(ko, used);
    } else {
        for (uint ko = 0u; ko < KO; ko++) window_row(ko, used);
    }
    uint o = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) o += coord[d] * AT(out_stride, d);
    o -= out_base;
#ifdef E_FLOAT
    float r[8];
    [[unroll]] for (uint j = 0u; j < V; j++) {
        float avg = INCLUDE_PADDING ? sum[j] / divisor
                                    : (cnt[j] == 0.0 ? 0.0 : sum[j] / cnt[j]);
        r[j] = MODE == 1 ? avg : best[j];
    }
#ifdef F32
    if (VEC_STORE && count == V) {    // V = 4 or 8, o a multiple of 4
        y4[o >> 2] = vec4(r[0], r[1], r[2], r[3]);
        if (V == 8u) y4[(o >> 2) + 1u] = vec4(r[4], r[5], r[6], r[7]);
        return;
    }
#endif
#endif
    uint ostep = AT(out_stride, LAST);
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) {
#ifdef E_FLOAT
            ESTORE(y, o + j * ostep, r[j]);
#else
            ESTORE(y, o + j * ostep, best[j]);
#endif
        }
    }
}
