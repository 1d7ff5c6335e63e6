#version 450
// DML_LP_POOLING_OPERATOR_DESC / DML_LP_POOLING1_OPERATOR_DESC:
//     Y = (|X1|^P + ... + |Xn|^P)^(1/P) over each (dilated) window; padding adds nothing.
// Arithmetic in float32 for float32 and float16 tensors.
//   P = 1:  the sum of |x| (no pow).
//   P = 2, SCALE off (float16 data: its squares cannot overflow or underflow float32):
//           sqrt of the sum of squares (no pow).
//   SCALE on (float32 with P = 2, every P > 2): scaled by the window's largest |x| = m,
//           m * (sum (|x|/m)^P)^(1/P), so the result is finite and accurate wherever the
//           true one is: for P = 2 the scale is an exact power of two and the root a
//           sqrt (no pow), for P > 2 a division and the power by repeated squaring.
//           With HOLD the window's values stay in registers between the two sums (one
//           read); without (large windows) the window is read twice.  No branch: lavapipe
//           runs both sides of a divergent branch, so a "rare" fallback would cost always.
// A NaN in the window gives NaN; an infinity (and no NaN) gives +inf.
//
// Reads: an invocation computes V neighbouring outputs of the last dimension; along it
// their windows cover T = S*(V-1) + L*(W-1) + 1 neighbouring inputs per window row (ROWS:
// T <= 32), each read once -- with TEXEL4 as aligned 4-element texels shifted into place
// (lavapipe gathers a texel per lane in one instruction; storage-buffer reads are scalar).
//
// vkml:variant lp_pooling_f32 F32=1
// vkml:variant lp_pooling_f32_texel F32=1 TEXEL=1
// vkml:variant lp_pooling_f32_texel4 F32=1 TEXEL4=1
// vkml:variant lp_pooling_f32_ssbo4 F32=1 TEXEL4=1 SSBO4=1
// vkml:variant lp_pooling_f16 F16=1
// vkml:variant lp_pooling_f16_packed F16_PACKED=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_float.glsl"
#define VKML_WINDOW_DIMS 3
#include "vkml_window.glsl"

#if defined(SSBO4)
// the TEXEL4 reads from a vec4 storage buffer (SwiftShader: one 16-byte load a lane)
layout(std430, set = 0, binding = 0) readonly buffer In4 { vec4 x4[]; };
#define FETCH4(i) x4[i]
#define LOAD(i) x4[(i) >> 2][(i) & 3u]
#elif defined(TEXEL)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#define LOAD(i) texelFetch(Xt, int(i)).x
#elif defined(TEXEL4)
layout(set = 0, binding = 0) uniform samplerBuffer Xt;     // RGBA32F: 4 elements a texel
#define LOAD(i) texelFetch(Xt, int((i) >> 2))[(i) & 3u]
#define FETCH4(i) texelFetch(Xt, i)
#else
layout(std430, set = 0, binding = 0) readonly buffer In { FSTORE_T x[]; };
#define LOAD(i) FLOAD(x, i)
#endif
layout(std430, set = 0, binding = 1) buffer Out { FSTORE_T y[]; };
#ifdef F32
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 or 5: N, C, 2 or 3 spatial
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 21) const uint V = 1u;      // outputs of the last dimension per invocation
layout(constant_id = 22) const bool VEC_STORE = false;   // V = 4 or 8 stored as vec4s
layout(constant_id = 24) const uint P = 2u;
layout(constant_id = 25) const bool SCALE = false;
layout(constant_id = 26) const bool HOLD = false;   // KO * T <= 64: values kept in registers

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension
    uvec4 in_size;                // spatial sizes
    ivec4 start;                  // StartPadding
    uint in_texels;               // TEXEL4: 4-element texels bound
};

#define VKML_BOX_COORD
#include "vkml_box.glsl"
const int D = RANK - 2;
const int LAST = RANK - 1;
const uint WL = RANK == 4 ? W1 : W2;  // the last spatial dimension's window,
const uint SL = RANK == 4 ? S1 : S2;  // stride
const uint LL = RANK == 4 ? L1 : L2;  // and dilation
const uint KO = W0 * W1 * W2 / WL;    // window positions of the outer spatial dimensions
const uint T = SL * (V - 1u) + LL * (WL - 1u) + 1u;   // inputs of a window row
const bool ROWS = T <= 32u;
const uint TR = ROWS ? T : 1u;

uint base;

// a^P for 0 <= a <= 1, by repeated squaring (P is a constant: this unrolls).
float pow_p(float a) {
    float r = 1.0, b = a;
    [[unroll]] for (int bit = 0; bit < 32; bit++) {
        if ((P >> bit) == 0u) break;
        if (((P >> bit) & 1u) != 0u) r *= b;
        b *= b;
    }
    return r;
}

// Offset of the outer window row `ko` of this invocation (all but the last spatial
// dimension), or false where it lies in the padding.
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

// Input t of a window row: last coordinate i0 + t, 0 in the padding.
float row_element(bool row_ok, uint off, int i0, uint t) {
    int i = i0 + int(t);
    bool ok = row_ok && uint(i) < in_size[D - 1];
    float v = LOAD(ok ? off + uint(i) * AT(in_stride, LAST) : 0u);
    return ok ? v : 0.0;
}

#ifdef TEXEL4
VKML_SHIFT4(vec4)
#endif

// The T inputs of window row `off` from last coordinate i0 (ROWS).
float row[32];
void load_row(bool row_ok, uint off, int i0) {
#ifdef TEXEL4
    // unit last input stride: T neighbours, as ceil(T / 4) + 1 aligned texels
    int e0 = int(off) + i0;
    int q = e0 >> 2;
    uint sh = uint(e0) & 3u;
    #ifdef SSBO4
    int last = int(x4.length()) - 1;       // this binding's (a window's) vec4s
#else
    int last = int(in_texels) - 1;
#endif
    vec4 prev = FETCH4(clamp(q, 0, last));
    [[unroll]] for (uint i = 0u; i < (TR + 3u) / 4u; i++) {
        vec4 next = FETCH4(clamp(q + int(i) + 1, 0, last));
        vec4 r = shift4(prev, next, sh);
        uvec4 c = uvec4(ivec4(i0 + int(4u * i)) + ivec4(0, 1, 2, 3));
        bvec4 ok = lessThan(c, uvec4(in_size[D - 1]));
        r = mix(vec4(0.0), r, ok);
        r = row_ok ? r : vec4(0.0);
        row[4u * i] = r.x;
        if (4u * i + 1u < TR) row[4u * i + 1u] = r.y;
        if (4u * i + 2u < TR) row[4u * i + 2u] = r.z;
        if (4u * i + 3u < TR) row[4u * i + 3u] = r.w;
        prev = next;
    }
#else
    [[unroll]] for (uint t = 0u; t < TR; t++) row[t] = row_element(row_ok, off, i0, t);
#endif
}

float vals[64];    // HOLD: the window's inputs, [ko * T + t]
float acc[8], mx[8];

// The input of window position (ko, kl) for output j: from `row` (ROWS), else read.
float value(bool row_ok, uint off, int i0, uint j, uint kl) {
    if (ROWS) return row[SL * j + LL * kl];
    return row_element(row_ok, off, i0, SL * j + LL * kl);
}

// First read of outer window row ko: P = 1 or unscaled P = 2 sums; with SCALE the
// largest |x| and the sum of |x| (it detects NaN), and with HOLD the values.
void first_position(bool row_ok, uint off, int i0, uint kl) {
    [[unroll]] for (uint j = 0u; j < V; j++) {
        float v = value(row_ok, off, i0, j, kl);
        float a = abs(v);
        acc[j] += (P == 2u && !SCALE) ? v * v : a;
        if (SCALE) mx[j] = max(mx[j], a);
    }
}

void first_read(uint ko) {
    uint off;
    bool row_ok = outer_row(ko, off);
    int i0 = int(coord[LAST] * SL) - start[D - 1];
    if (ROWS) {             // unrolled only then: a long window row compiles slowly
        load_row(row_ok, off, i0);
        [[unroll]] for (uint kl = 0u; kl < WL; kl++) first_position(row_ok, off, i0, kl);
    } else {
        for (uint kl = 0u; kl < WL; kl++) first_position(row_ok, off, i0, kl);
    }
    if (HOLD) {
        [[unroll]] for (uint t = 0u; t < TR; t++) vals[ko * TR + t] = row[t];
    }
}

// One value's share of the scaled sum: (|v| * scale)^2 for P = 2 (scale a power of two
// given as two factors, each a normal float), (|v| / m)^P otherwise.
float share(float v, float m, float s1, float s2) {
    float a = abs(v);
    if (P == 2u) { float t = a * s1 * s2; return t * t; }
    return pow_p(a / m);
}

void main() {
    if (box_outside()) return;
    box_coord();
    uint count = min(V, AT(origin, LAST) + AT(extent, LAST) - coord[LAST]);
    uint out_off = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) out_off += coord[d] * AT(out_stride, d);
    base = coord[0] * in_stride[0].x + coord[1] * in_stride[0].y - in_base;

    [[unroll]] for (uint j = 0u; j < 8u; j++) { acc[j] = 0.0; mx[j] = 0.0; }
    if (HOLD) {
        [[unroll]] for (uint ko = 0u; ko < KO; ko++) first_read(ko);
    } else {
        for (uint ko = 0u; ko < KO; ko++) first_read(ko);
    }
    float r[8];
    if (!SCALE) {
        [[unroll]] for (uint j = 0u; j < V; j++) r[j] = P == 2u ? sqrt(acc[j]) : acc[j];
    } else {
        float s1[8], s2[8], sum[8];
        [[unroll]] for (uint j = 0u; j < V; j++) {
            // 2^(127 - e) for m's biased exponent e (m * it in [1, 2)), as two normal
            // factors (the whole may be below the smallest normal float)
            int e = clamp(int(floatBitsToUint(mx[j]) >> 23), 1, 254);
            int h = (127 - e) / 2;
            s1[j] = uintBitsToFloat(uint(127 + h) << 23);
            s2[j] = uintBitsToFloat(uint(127 + (127 - e - h)) << 23);
            sum[j] = 0.0;
        }
        if (HOLD) {
            [[unroll]] for (uint ko = 0u; ko < KO; ko++) {
                [[unroll]] for (uint kl = 0u; kl < WL; kl++) {
                    [[unroll]] for (uint j = 0u; j < V; j++)
                        sum[j] += share(vals[ko * TR + SL * j + LL * kl], mx[j], s1[j], s2[j]);
                }
            }
        } else {
            for (uint ko = 0u; ko < KO; ko++) {
                uint off;
                bool row_ok = outer_row(ko, off);
                int i0 = int(coord[LAST] * SL) - start[D - 1];
                if (ROWS) {
                    load_row(row_ok, off, i0);
                    [[unroll]] for (uint kl = 0u; kl < WL; kl++) {
                        [[unroll]] for (uint j = 0u; j < V; j++)
                            sum[j] += share(value(row_ok, off, i0, j, kl), mx[j], s1[j], s2[j]);
                    }
                } else {
                    for (uint kl = 0u; kl < WL; kl++) {
                        [[unroll]] for (uint j = 0u; j < V; j++)
                            sum[j] += share(value(row_ok, off, i0, j, kl), mx[j], s1[j], s2[j]);
                    }
                }
            }
        }
        [[unroll]] for (uint j = 0u; j < V; j++) {
            float m = mx[j];
            float y = P == 2u ? sqrt(sum[j]) / s1[j] / s2[j] : m * pow(sum[j], 1.0 / float(P));
            y = m == 0.0 ? 0.0 : y;
            y = isinf(m) ? m : y;
            r[j] = isnan(acc[j]) ? acc[j] : y;     // acc: the sum of |x|, NaN if one is
        }
    }
    uint o = out_off - out_base;
#ifdef F32
    if (VEC_STORE && count == V) {    // V = 4 or 8, o a multiple of 4
        y4[o >> 2] = vec4(r[0], r[1], r[2], r[3]);
        if (V == 8u) y4[(o >> 2) + 1u] = vec4(r[4], r[5], r[6], r[7]);
        return;
    }
#endif
    uint ostep = AT(out_stride, LAST);
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) FSTORE(y, o + j * ostep, r[j]);
    }
}
