#version 450
// LP pooling (see glsl/lp_pooling.comp for the operator) for drivers whose storage-buffer
// loads are per-lane gathers and that do not fold specialization constants (SwiftShader;
// see docs/DEVELOPING.md): an invocation computes LP_V neighbouring outputs of the last
// dimension from whole input row segments read as RGBA32F texels (a uniform texel buffer
// of unit last stride, bound per window of at most maxTexelBufferElements texels).  Each
// window row's LP_T inputs (shared by the LP_V overlapping windows) are fetched once as
// LP_NT aligned texels; |x|^P (P = 1, 2) of each is summed over the window rows into a
// column sum, and each output adds its LP_WL columns.  The LP_* constants are compile-time
// (variants) or frozen on the host (its vkml:frozen line below): every
// [[unroll]] loop over them unrolls and the arrays they index are registers.  The outer
// window rows (A, B) stay rolled loops.
//
// Variants: the last dimension's window, stride, dilation and row shift (LP_SHIFT), all
// compile-time, and P = 1 or 2 compile-time (suffix p1, p2; without one P is frozen);
// the host offers "block" only where one exists.
//
// P = 2: the sum of squares is exact wherever it is a normal float >= 2^-100 and finite
// (each square lost to underflow is < 2^-149); other sums (inf, tiny, 0) are summed again
// with the inputs scaled by a power of two (variant p2; see the end of main), in a loop
// that runs only while some lane needs it, except where the window's whole segment is
// zeros.  The variants without P (every P > 2 here) sum every output again scaled by the
// window's largest |x| (as lp_pooling.comp).  NaN propagates.
//
// vkml:variant lp_pooling_f32_block_w2s2d1h0 F32=1 BW=2u BS=2u BL=1u SH=0u
// vkml:variant lp_pooling_f32_block_w2s2d1h0p1 F32=1 BW=2u BS=2u BL=1u SH=0u PP=1u
// vkml:variant lp_pooling_f32_block_w2s2d1h0p2 F32=1 BW=2u BS=2u BL=1u SH=0u PP=2u
// vkml:variant lp_pooling_f32_block_w2s2d1h1 F32=1 BW=2u BS=2u BL=1u SH=1u
// vkml:variant lp_pooling_f32_block_w2s2d1h1p1 F32=1 BW=2u BS=2u BL=1u SH=1u PP=1u
// vkml:variant lp_pooling_f32_block_w2s2d1h1p2 F32=1 BW=2u BS=2u BL=1u SH=1u PP=2u
// vkml:variant lp_pooling_f32_block_w2s2d1h2 F32=1 BW=2u BS=2u BL=1u SH=2u
// vkml:variant lp_pooling_f32_block_w2s2d1h2p1 F32=1 BW=2u BS=2u BL=1u SH=2u PP=1u
// vkml:variant lp_pooling_f32_block_w2s2d1h2p2 F32=1 BW=2u BS=2u BL=1u SH=2u PP=2u
// vkml:variant lp_pooling_f32_block_w2s2d1h3 F32=1 BW=2u BS=2u BL=1u SH=3u
// vkml:variant lp_pooling_f32_block_w2s2d1h3p1 F32=1 BW=2u BS=2u BL=1u SH=3u PP=1u
// vkml:variant lp_pooling_f32_block_w2s2d1h3p2 F32=1 BW=2u BS=2u BL=1u SH=3u PP=2u
// vkml:variant lp_pooling_f32_block_w3s1d1h0 F32=1 BW=3u BS=1u BL=1u SH=0u
// vkml:variant lp_pooling_f32_block_w3s1d1h0p1 F32=1 BW=3u BS=1u BL=1u SH=0u PP=1u
// vkml:variant lp_pooling_f32_block_w3s1d1h0p2 F32=1 BW=3u BS=1u BL=1u SH=0u PP=2u
// vkml:variant lp_pooling_f32_block_w3s1d1h1 F32=1 BW=3u BS=1u BL=1u SH=1u
// vkml:variant lp_pooling_f32_block_w3s1d1h1p1 F32=1 BW=3u BS=1u BL=1u SH=1u PP=1u
// vkml:variant lp_pooling_f32_block_w3s1d1h1p2 F32=1 BW=3u BS=1u BL=1u SH=1u PP=2u
// vkml:variant lp_pooling_f32_block_w3s1d1h2 F32=1 BW=3u BS=1u BL=1u SH=2u
// vkml:variant lp_pooling_f32_block_w3s1d1h2p1 F32=1 BW=3u BS=1u BL=1u SH=2u PP=1u
// vkml:variant lp_pooling_f32_block_w3s1d1h2p2 F32=1 BW=3u BS=1u BL=1u SH=2u PP=2u
// vkml:variant lp_pooling_f32_block_w3s1d1h3 F32=1 BW=3u BS=1u BL=1u SH=3u
// vkml:variant lp_pooling_f32_block_w3s1d1h3p1 F32=1 BW=3u BS=1u BL=1u SH=3u PP=1u
// vkml:variant lp_pooling_f32_block_w3s1d1h3p2 F32=1 BW=3u BS=1u BL=1u SH=3u PP=2u
// vkml:variant lp_pooling_f32_block_w3s2d1h0 F32=1 BW=3u BS=2u BL=1u SH=0u
// vkml:variant lp_pooling_f32_block_w3s2d1h0p1 F32=1 BW=3u BS=2u BL=1u SH=0u PP=1u
// vkml:variant lp_pooling_f32_block_w3s2d1h0p2 F32=1 BW=3u BS=2u BL=1u SH=0u PP=2u
// vkml:variant lp_pooling_f32_block_w3s2d1h1 F32=1 BW=3u BS=2u BL=1u SH=1u
// vkml:variant lp_pooling_f32_block_w3s2d1h1p1 F32=1 BW=3u BS=2u BL=1u SH=1u PP=1u
// vkml:variant lp_pooling_f32_block_w3s2d1h1p2 F32=1 BW=3u BS=2u BL=1u SH=1u PP=2u
// vkml:variant lp_pooling_f32_block_w3s2d1h2 F32=1 BW=3u BS=2u BL=1u SH=2u
// vkml:variant lp_pooling_f32_block_w3s2d1h2p1 F32=1 BW=3u BS=2u BL=1u SH=2u PP=1u
// vkml:variant lp_pooling_f32_block_w3s2d1h2p2 F32=1 BW=3u BS=2u BL=1u SH=2u PP=2u
// vkml:variant lp_pooling_f32_block_w3s2d1h3 F32=1 BW=3u BS=2u BL=1u SH=3u
// vkml:variant lp_pooling_f32_block_w3s2d1h3p1 F32=1 BW=3u BS=2u BL=1u SH=3u PP=1u
// vkml:variant lp_pooling_f32_block_w3s2d1h3p2 F32=1 BW=3u BS=2u BL=1u SH=3u PP=2u
#extension GL_EXT_control_flow_attributes : require
layout(set = 0, binding = 0) uniform samplerBuffer Xt;      // RGBA32F: 4 elements a texel
layout(std430, set = 0, binding = 1) buffer Out { float y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 or 5: N, C, 2 or 3 spatial
layout(constant_id = 2) const int XDIMS = 1;     // always 1 here
#define VKML_WINDOW_DIMS 3
#include "vkml_window.glsl"
// the last dimension's window, stride and dilation: compile-time (a variant each), so
// every [[unroll]] loop unrolls when the module is built and its arrays are registers
const uint LP_WL = BW, LP_SL = BS, LP_LL = BL;
// where a row segment's input 0 lies in its first texel, the same for every row and lane
// (the host checks: 16-byte aligned rows and bindings); a per-lane shift made
// SwiftShader's pipeline compilation run for minutes
const uint LP_SHIFT = SH;
const uint LP_V = 8u;                              // outputs per invocation
const uint LP_T = LP_SL * (LP_V - 1u) + LP_LL * (LP_WL - 1u) + 1u;   // inputs of a row segment
const uint LP_NT = (LP_T + 6u) / 4u;               // texels fetched per row
#ifdef PP
// P = 1 or 2 compile-time (the variants ending in p1, p2): glslc -O folds it before
// SwiftShader sees the module (which runs the frozen P's code slower)
const uint LP_P = PP;
#else
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: LP_P and LP_VSTORE select code (the power's
// special cases, the vec4 stores).
// vkml:frozen LP_P LP_VSTORE
layout(constant_id = 26) const uint LP_P = 2u;
#endif
layout(constant_id = 28) const bool LP_VSTORE = false;   // the V outputs stored as vec4s

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension
    uvec4 in_size;                // spatial sizes
    ivec4 start;                  // StartPadding
    uint in_texels;               // (unused here)
};

#include "vkml_box.glsl"

const bool R5 = RANK == 5;
const int D = RANK - 2;
// the outer spatial dimensions as A (3-D only; 1 wide in 2-D) and B
const uint WA = R5 ? W0 : 1u, SA = R5 ? S0 : 1u, LA = R5 ? L0 : 1u;
const uint WB = R5 ? W1 : W0, SB = R5 ? S1 : S0, LB = R5 ? L1 : L0;

// a^P for 0 <= a <= 1 by repeated squaring
float pow_p(float a) {
    float r = 1.0, b = a;
    for (uint q = LP_P; q != 0u; q >>= 1) {
        r = (q & 1u) != 0u ? r * b : r;
        b *= b;
    }
    return r;
}

int last_texel;
int iL0;            // last coordinate of the segment's first input
uint sL;
vec4 f[LP_NT];      // a row's texels

// Fetch the texels of the row segment whose first input is element e0 of the binding.
void fetch(int e0) {
    int q = e0 >> 2;
    [[unroll]] for (uint i = 0u; i < LP_NT; i++)
        f[i] = texelFetch(Xt, clamp(q + int(i), 0, last_texel));
}

// Whether input t of a segment of a row inside the input lies inside it.
bool row_ok(bool okr, uint t) {
    return okr && uint(iL0 + int(t)) < sL;
}

// Input t of the fetched segment (shift sh: where input 0 lies in texel 0); 0 outside the
// row or where the whole row is padding.
float seg(uint t, uint sh, bool okr) {
    // the four candidates (constant indices once unrolled), chosen by the shift
    uint k = t;
    float e0 = f[k >> 2u][k & 3u];
    k = t + 1u;
    float e1 = f[k >> 2u][k & 3u];
    k = t + 2u;
    float e2 = f[k >> 2u][k & 3u];
    k = t + 3u;
    float e3 = f[k >> 2u][k & 3u];
    float v = (sh & 2u) != 0u ? ((sh & 1u) != 0u ? e3 : e2) : ((sh & 1u) != 0u ? e1 : e0);
    return row_ok(okr, t) ? v : 0.0;
}

void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint gy = gl_GlobalInvocationID.y;
    if (!(gx < x_count && gy < AT(extent, RANK - 2))) return;
    // z: (N, C) in 2-D, (N, C, A) in 3-D
    uint z = gl_GlobalInvocationID.z;
    uint ca = 0u;
    if (R5) {
        uint q = divide(z, 2);
        ca = origin[0].z + z - q * extent[0].z;
        z = q;
    }
    uint q1 = divide(z, 1);
    uint cc = origin[0].y + z - q1 * extent[0].y;
    uint cn = origin[0].x + q1;
    uint cb = AT(origin, RANK - 2) + gy;
    uint cl = AT(origin, RANK - 1) + gx * LP_V;
    uint count = min(LP_V, AT(origin, RANK - 1) + AT(extent, RANK - 1) - cl);

    uint sA = R5 ? in_size.x : 1u, sB = in_size[D - 2];
    sL = in_size[D - 1];
    uint tA = R5 ? in_stride[0].z : 0u, tB = AT(in_stride, RANK - 2);
    int iA0 = R5 ? int(ca * SA) - start.x : 0;
    int iB0 = int(cb * SB) - start[D - 2];
    iL0 = int(cl * LP_SL) - start[D - 1];
    int gbase = int(cn * in_stride[0].x + cc * in_stride[0].y - in_base) + iL0;
    last_texel = textureSize(Xt) - 1;

    float col[LP_T];
    float r[LP_V];
    [[unroll]] for (uint j = 0u; j < LP_V; j++) r[j] = 0.0;
#ifdef PP
    // P = 1, 2: the column sums, texel by texel (each fetched texel's inputs summed before
    // the next is fetched: faster than fetching all LP_NT texels first)
    [[unroll]] for (uint t = 0u; t < LP_T; t++) col[t] = 0.0;
    for (uint ka = 0u; ka < WA; ka++) {
        int ia = iA0 + int(ka * LA);
        bool oka = uint(ia) < sA;
        for (uint kb = 0u; kb < WB; kb++) {
            int ib = iB0 + int(kb * LB);
            bool okr = oka && uint(ib) < sB;
            int q0 = (gbase + ia * int(tA) + ib * int(tB)) >> 2;
            [[unroll]] for (uint i = 0u; i < LP_NT; i++) {
                vec4 tx = texelFetch(Xt, clamp(q0 + int(i), 0, last_texel));
                tx = okr ? tx : vec4(0.0);
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    uint t = 4u * i + c - LP_SHIFT;     // below 0 wraps: not in the segment
                    if (t < LP_T) col[t] += LP_P == 1u ? abs(tx[c]) : tx[c] * tx[c];
                }
            }
        }
    }
    // columns outside the row (other rows' inputs, maybe inf or NaN) count nothing
    [[unroll]] for (uint t = 0u; t < LP_T; t++) col[t] = row_ok(true, t) ? col[t] : 0.0;
    uint bad = 0u;              // P = 2: outputs summed again, scaled
    [[unroll]] for (uint j = 0u; j < LP_V; j++) {
        float s = 0.0;
        [[unroll]] for (uint kl = 0u; kl < LP_WL; kl++) s += col[j * LP_SL + kl * LP_LL];
        r[j] = LP_P == 1u ? s : sqrt(s);
        // P = 2: exact unless inf, NaN or under 2^-100
        bad |= LP_P == 2u && !(s >= 7.8886090522101181e-31 && s <= 3.4028234663852886e38)
               ? 1u << j : 0u;
    }
    bad &= (1u << count) - 1u;
    // (a loop no lane enters unless some sum was tiny, 0, inf or NaN) a segment of zeros, every
    // window row's texels ORed: its zero windows stay exact zeros, not summed again (the
    // tuner's scratch tensors are all zeros: they would time the slow path otherwise)
    for (uint once = 0u; once < (bad != 0u ? 1u : 0u); once++) {
        uvec4 b = uvec4(0u);
        for (uint ka = 0u; ka < WA; ka++)
            for (uint kb = 0u; kb < WB; kb++) {
                int q0 = (gbase + (iA0 + int(ka * LA)) * int(tA) + (iB0 + int(kb * LB)) * int(tB))
                         >> 2;
                [[unroll]] for (uint i = 0u; i < LP_NT; i++)
                    b |= floatBitsToUint(texelFetch(Xt, clamp(q0 + int(i), 0, last_texel)));
            }
        b &= 0x7fffffffu;
        bad = (b.x | b.y | b.z | b.w) != 0u ? bad : 0u;
    }
#else
    [[unroll]] for (uint t = 0u; t < LP_T; t++) col[t] = 0.0;
    uint badmask = LP_P > 2u ? 0xffffffffu : 0u;    // outputs summed again, scaled
    if (LP_P <= 2u) {
        for (uint ka = 0u; ka < WA; ka++) {
            int ia = iA0 + int(ka * LA);
            bool oka = uint(ia) < sA;
            for (uint kb = 0u; kb < WB; kb++) {
                int ib = iB0 + int(kb * LB);
                bool okr = oka && uint(ib) < sB;
                fetch(gbase + ia * int(tA) + ib * int(tB));
                [[unroll]] for (uint t = 0u; t < LP_T; t++) {
                    float v = seg(t, LP_SHIFT, okr);
                    col[t] += LP_P == 1u ? abs(v) : v * v;
                }
            }
        }
        [[unroll]] for (uint j = 0u; j < LP_V; j++) {
            float s = 0.0;
            [[unroll]] for (uint kl = 0u; kl < LP_WL; kl++) s += col[j * LP_SL + kl * LP_LL];
            r[j] = LP_P == 1u ? s : sqrt(s);
            // P = 2: not exact (inf, < 2^-100 or 0); NaN stays NaN
            bool bad = LP_P == 2u && !isnan(s) && (!(s >= 7.8886090522101181e-31) || isinf(s));
            badmask |= bad ? 1u << j : 0u;
        }
    }
#endif
    uint o = cn * out_stride[0].x + cc * out_stride[0].y + (R5 ? ca * out_stride[0].z : 0u)
             + cb * AT(out_stride, RANK - 2) + cl * AT(out_stride, RANK - 1) - out_base;
    uint ostep = AT(out_stride, RANK - 1);
#ifdef PP
    // Stores: the 8 outputs as two vec4s where they can be; every other output of the
    // invocation (a row's short last invocation, outputs not packed) and P = 2's outputs
    // summed again (over the vec4s) in one rolled loop with one scalar store: SwiftShader
    // pays for each store in the code (per-lane branches) even where no lane runs it, 10%
    // of this kernel for the 8 stores of a row's tail.
    bool vec = LP_VSTORE && count == LP_V;
    if (vec) {
        [[unroll]] for (uint j = 0u; j < LP_V / 4u; j++)
            y4[(o >> 2) + j] = vec4(r[4u * j], r[4u * j + 1u], r[4u * j + 2u], r[4u * j + 3u]);
    }
    for (uint left = (vec ? 0u : (1u << count) - 1u) | bad; left != 0u; left &= left - 1u) {
        uint j = findLSB(left);
        float v = r[0];
        [[unroll]] for (uint k = 1u; k < LP_V; k++) v = j == k ? r[k] : v;
        // P = 2, rare (a loop no lane enters unless some sum was inf, NaN or under
        // 2^-100): the output summed again, each input scaled by 2^-100 (the sum was inf)
        // or 2^100 (under 2^-100, 0 included) before it is squared, the root scaled back.
        // Down: the sum of n squares overflowed, so the largest |x| is >= 2^64 / sqrt(n):
        // what the scaled squares lose to underflow (< 2^-149 each) is under n^2 2^-77 of
        // their sum, and none overflows (<= 2^56).  Up: every |x| < 2^-50, so the scaled
        // squares are < 2^100 and none underflows (>= 2^-98).  An inf input stays inf, a
        // NaN NaN, and a true result over the float range is inf.  (A single scale, where
        // lp_pooling.comp scales by the window's largest |x|: its first pass made this
        // kernel 2.5 times slower on SwiftShader; code in loops no lane enters is not free
        // there.)
        for (uint once = 0u; once < ((bad >> j) & 1u); once++) {
            bool dn = v > 1.0;                  // the first result: inf (NaN, tiny, 0: up)
            float scale = dn ? 7.8886090522101181e-31 : 1.2676506002282294e30; // 2^-100, 2^100
            float sum = 0.0;
            for (uint ka = 0u; ka < WA; ka++) {
                int ia = iA0 + int(ka * LA);
                bool oka = uint(ia) < sA;
                for (uint kb = 0u; kb < WB; kb++) {
                    int ib = iB0 + int(kb * LB);
                    bool okr = oka && uint(ib) < sB;
                    int e0 = gbase + ia * int(tA) + ib * int(tB);
                    [[dont_unroll]] for (uint kl = 0u; kl < LP_WL; kl++) {
                        uint t = j * LP_SL + kl * LP_LL;
                        int ei = e0 + int(t);
                        float x = texelFetch(Xt, clamp(ei >> 2, 0, last_texel))[ei & 3];
                        x = row_ok(okr, t) ? x * scale : 0.0;
                        sum += x * x;
                    }
                }
            }
            v = sqrt(sum) * (dn ? 1.2676506002282294e30 : 7.8886090522101181e-31);
        }
        y[o + j * ostep] = v;
    }
#else
    if (LP_P <= 2u) {
        if (LP_VSTORE) {
            if (count == LP_V) {
                [[unroll]] for (uint j = 0u; j < LP_V / 4u; j++)
                    y4[(o >> 2) + j] = vec4(r[4u * j], r[4u * j + 1u], r[4u * j + 2u],
                                            r[4u * j + 3u]);
            }
            // a row's short last invocation (a loop: skipped where no lane has one; r
            // indexed by constants only)
            for (uint once = 0u; once < (count == LP_V ? 0u : 1u); once++) {
                [[unroll]] for (uint j = 0u; j < LP_V; j++)
                    if (j < count) y[o + j] = r[j];
            }
        } else {
            [[unroll]] for (uint j = 0u; j < LP_V; j++)
                if (j < count) y[o + j * ostep] = r[j];
        }
    }
    // The outputs in badmask, one at a time (rolled, rare for P <= 2): the largest |x| m,
    // then the sum of (|x| / m)^P (P = 2: scaled by powers of two, exact), m sum^(1/P),
    // stored over the first pass's result.
    badmask &= count >= 32u ? 0xffffffffu : (1u << count) - 1u;
    for (uint j = findLSB(badmask); badmask != 0u; j = findLSB(badmask)) {
        badmask &= badmask - 1u;
        float m = 0.0;
        bool nan = false;
        for (uint pass = 0u; pass < 2u; pass++) {
            // pass 0: m; pass 1: the scaled sum
            int e = clamp(int(floatBitsToUint(m) >> 23), 1, 254);
            int h = (127 - e) / 2;
            float f1 = intBitsToFloat((127 + h) << 23);
            float f2 = intBitsToFloat((127 + (127 - e - h)) << 23);
            float sum = 0.0;
            for (uint ka = 0u; ka < WA; ka++) {
                int ia = iA0 + int(ka * LA);
                bool oka = uint(ia) < sA;
                for (uint kb = 0u; kb < WB; kb++) {
                    int ib = iB0 + int(kb * LB);
                    bool okr = oka && uint(ib) < sB;
                    int e0 = gbase + ia * int(tA) + ib * int(tB);
                    [[dont_unroll]] for (uint kl = 0u; kl < LP_WL; kl++) {
                        uint t = j * LP_SL + kl * LP_LL;
                        int ei = e0 + int(t);
                        float v = texelFetch(Xt, clamp(ei >> 2, 0, last_texel))[ei & 3];
                        float a = row_ok(okr, t) ? abs(v) : 0.0;
                        if (pass == 0u) {
                            m = isnan(a) ? m : max(m, a);
                            nan = nan || isnan(a);
                        } else if (LP_P == 2u) {
                            float u = a * f1 * f2;
                            sum += u * u;
                        } else {
                            sum += pow_p(a / m);
                        }
                    }
                }
            }
            if (pass == 1u) {
                float s = LP_P == 2u ? sqrt(sum) / f1 / f2 : m * pow(sum, 1.0 / float(LP_P));
                s = m == 0.0 ? 0.0 : s;
                s = isinf(m) ? m : s;
                s = nan ? uintBitsToFloat(0x7fc00000u) : s;
                y[o + j * ostep] = s;
            }
        }
    }
#endif
}
