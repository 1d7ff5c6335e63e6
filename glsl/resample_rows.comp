#version 450
// DML_RESAMPLE1_OPERATOR_DESC, the rows path (vkml/ops/resample.py, path "rows"): a
// resample whose last dimension is upsampled by 2 with a map of period 2 (output 2k + j
// reads input k + D[j], and k + D[j] + 1 weighted WT[j] for linear, D[j] in {-1, 0},
// clamped to the row; nearest: D = 0), whatever the other dimensions' maps.  The host
// compares this map with the general kernel's (glsl/resample.comp's `locate`, evaluated
// on the host) at every output coordinate and takes this path only where they agree.
//
// An invocation writes 8 Q consecutive outputs of one output row from Q input quads
// (RGBA32 texels or vec4 storage loads; lavapipe vectorizes texel fetches, not scalar
// storage loads), plus for linear the quads holding the two neighbours; the outer
// dimensions' input rows (one, or two weighted for linear) come from `locate` once an
// invocation.  Stores are u64vec4s (U64) or vec4s; nearest stores them to the REP_H
// output rows that read the same input row (lavapipe 1.15x, SwiftShader 1.9x faster than
// an invocation a row), for ROWS_K consecutive input rows.  The general kernel computes
// each output's coordinate and fetches its inputs one by one: on lavapipe and SwiftShader
// that, not the bytes, was its cost.  Nearest moves bits (any 32-bit type).  Linear
// computes in float32, the two input rows combined before the row's interpolation (three
// operations an input instead of an output; the general kernel's order differs by a
// rounding).
//
// PAIRS (nearest, the near2 variants): rows of whole input pairs but not quads (widths
// 10 and 14 of YOLOv8n's and U-Net's upsamples) read RG32 texels or uvec2 loads, 2 Q pairs
// an invocation, each stored as one T4; output rows must start on 4 elements.
//
// PAIR (linear, the dimension before the last upsampled by 2 with a map of period 2 too:
// output row 2r + j interpolates input rows clamp(r + H[j]) and the next, weighted
// WH[j], H[j] in {-1, 0}): an invocation computes REP_H / 2 consecutive pairs of output
// rows 2r, 2r + 1, each from the three input rows r + H[0] .. r + H[0] + 2 (two where
// H[0] = H[1]), walking down the rows with the last two in registers: each input row is
// read once for two output rows, and the index work is shared by all of them.
//
// vkml:variant resample_rows_near_texel NEAR=1 TEXEL=1
// vkml:variant resample_rows_near_ssbo NEAR=1
// vkml:variant resample_rows_near_texel_u64 NEAR=1 TEXEL=1 U64=1
// vkml:variant resample_rows_near_ssbo_u64 NEAR=1 U64=1
// vkml:variant resample_rows_near2_texel NEAR=1 PAIRS=1 TEXEL=1
// vkml:variant resample_rows_near2_ssbo NEAR=1 PAIRS=1
// vkml:variant resample_rows_near2_texel_u64 NEAR=1 PAIRS=1 TEXEL=1 U64=1
// vkml:variant resample_rows_near2_ssbo_u64 NEAR=1 PAIRS=1 U64=1
// vkml:variant resample_rows_lin_texel TEXEL=1
// vkml:variant resample_rows_lin_ssbo
// vkml:variant resample_rows_lin_texel_u64 TEXEL=1 U64=1
// vkml:variant resample_rows_lin_ssbo_u64 U64=1
// vkml:variant resample_rows_pair_texel PAIR=1 TEXEL=1
// vkml:variant resample_rows_pair_ssbo PAIR=1
// vkml:variant resample_rows_pair_texel_u64 PAIR=1 TEXEL=1 U64=1
// vkml:variant resample_rows_pair_ssbo_u64 PAIR=1 U64=1
//
// Mode and read path are variants, not specialization constants: SwiftShader runs both
// sides of a branch on an unfrozen constant (docs/DEVELOPING.md).
#extension GL_EXT_control_flow_attributes : enable

#ifdef NEAR
#define T uint
#define T4 uvec4
#define BITS4(v) (v)
#ifdef TEXEL
layout(set = 0, binding = 0) uniform usamplerBuffer Xt;
#endif
#else
#define T float
#define T4 vec4
#define BITS4(v) floatBitsToUint(v)
#ifdef TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer Xt;
#endif
#endif
#ifdef TEXEL
#define LOAD4(q) texelFetch(Xt, int(q))
#elif defined(PAIRS)
layout(std430, set = 0, binding = 0) readonly buffer In { uvec2 x2[]; };
#define LOAD4(q) uvec4(x2[q], 0u, 0u)
#else
layout(std430, set = 0, binding = 0) readonly buffer In { T4 x4[]; };
#define LOAD4(q) x4[q]
#endif
layout(std430, set = 0, binding = 1) writeonly buffer Out4 { T4 y4[]; };
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
layout(std430, set = 0, binding = 1) writeonly buffer Out8 { u64vec4 y8[]; };
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // dimensions of the box (1 to 5)
layout(constant_id = 6) const uint LIN_MASK = 0u;  // bit d: dimension d interpolated
// D[0], D[1] of the map (-1 or 0), frozen into the module by the host (vkml.runtime.spirv)
// so that the window's selects fold on both drivers
// vkml:frozen PHASE_D0 PHASE_D1
layout(constant_id = 7) const int PHASE_D0 = 0;
layout(constant_id = 8) const int PHASE_D1 = 0;
// output rows an invocation stores, the grid's y counting groups of them.  Nearest: the
// dimension before the last's map is o // REP_H there (they are the same row).  PAIR:
// REP_H / 2 pairs of output rows, walking down the input rows (each read once).  Frozen:
// the PAIR loop's trip count is then a plain constant on both drivers.
// vkml:frozen REP_H
layout(constant_id = 9) const uint REP_H = 1u;
// PAIR: H[0], H[1] of the dimension before the last (-1 or 0), frozen as PHASE_D0/D1
// vkml:frozen PHASE_H0 PHASE_H1
layout(constant_id = 10) const int PHASE_H0 = 0;
layout(constant_id = 11) const int PHASE_H1 = 0;
// 1: every row holds whole groups of Q input quads and every output row starts on 8
// elements (the host's check), so a live invocation always stores whole u64vec4s (or
// whole T4s) and the partial store below is compiled out.  Frozen: SwiftShader emits a
// per-lane branch for every store site with per-lane addresses, taken or not
// (docs/DEVELOPING.md), and the partial store's 2 Q T4 sites sat beside the 2 Q stored.
// vkml:frozen FULL
layout(constant_id = 12) const uint FULL = 0u;
// nearest, where the dimension before the last's map is o // REP_H exactly: consecutive
// input rows an invocation copies (walking down them: the index work and an invocation's
// fixed cost shared by ROWS_K rows), the grid's y counting groups of them.  Frozen: the
// loop's trip count a plain constant.
// vkml:frozen ROWS_K
layout(constant_id = 13) const uint ROWS_K = 1u;
// linear: WT[0], WT[1], the weights of the row's two phases, and for PAIR WH[0], WH[1],
// those of the dimension before.  Frozen: as uniform-block members they were loaded in
// every pass of the PAIR loop (lavapipe does not move a uniform load past the loop's
// stores), and as constants the weights' (1 - w) and products fold.
// vkml:frozen WT0 WT1 WH0 WH1
layout(constant_id = 14) const float WT0 = 0.0;
layout(constant_id = 15) const float WT1 = 0.0;
layout(constant_id = 16) const float WH0 = 0.0;
layout(constant_id = 17) const float WH1 = 0.0;
// rows narrower than a workgroup (input rows of fewer than 8 invocations): SPREAD > 1
// output-row groups share one workgroup row along x, SPREAD_X (the invocations a row)
// lanes each, so the lanes are not idle past a row's end; the grid's y then counts
// groups of SPREAD rows over the flattened rows of the whole box (z is 0), a plane's
// last rows and the next plane's first sharing a workgroup.  Frozen: the division by
// SPREAD_X becomes a multiply.
// vkml:frozen SPREAD SPREAD_X
layout(constant_id = 18) const uint SPREAD = 1u;
layout(constant_id = 19) const uint SPREAD_X = 1u;
// input quads an invocation: compile-time, so its arrays are registers on both drivers
// (4 was no faster on lavapipe and slower on SwiftShader)
const uint Q = 2u;
const uint NW = 4u * Q + 2u;                     // window: input positions 4 m0 - 1 ...

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];         // elements; the last dimension's is 1
    uvec4 in_stride[2];          // elements, multiples of 4; the last dimension's is 1
    uvec4 in_size[2];
    vec4 coord_a[2];             // x = o * a + b per dimension (the general kernel's)
    vec4 coord_b[2];
    uvec4 phase;                 // x: input quads a row
};

layout(push_constant) uniform Push {
    uvec4 origin[2];             // the last dimension in input quads
    uvec4 extent[2];
    uint x_count;                // invocations along x (a row's, with SPREAD)
    uint flat_rows;              // SPREAD: row groups in the box (the y extent times z's)
    uint pad1, pad2;
    uvec4 magic[2];              // ceil(2^32 / extent): see divide()
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

// glsl/resample.comp's locate, unchanged: the host's check compares the last dimension's
// map with it, and the other dimensions take it as it is
void locate(int d, uint o, out uint i0, out uint i1, out float w) {
    precise float xf = float(o) * AT(coord_a, d) + AT(coord_b, d);
    xf = clamp(xf, -1.0, float(AT(in_size, d)));
    float f = floor(xf);
    float fr = xf - f;
    int i = int(f);
    int last = int(AT(in_size, d)) - 1;
#ifdef NEAR
    bool lin = false;
#else
    bool lin = ((LIN_MASK >> d) & 1u) != 0u;
#endif
    int n = lin ? i : i + (fr >= 0.5 ? 1 : 0);
    i0 = uint(clamp(n, 0, last));
    i1 = uint(clamp(i + 1, 0, last));
    w = lin ? fr : 0.0;
}

#ifndef NEAR
// one input row's window: input positions 4 m0 - 1 + i, i < NW, clamped to the row
void load_window(uint row, uint m0, uint lastq, out T r[NW]) {
    T4 left = LOAD4(row + (m0 == 0u ? 0u : m0 - 1u));
    r[0] = m0 == 0u ? left.x : left.w;
    [[unroll]] for (uint k = 0u; k <= Q; k++) {
        // a quad past the row reads the row's last quad, whose .w is its last input
        T4 v = LOAD4(row + min(m0 + k, lastq));
        v = m0 + k > lastq ? v.wwww : v;
        [[unroll]] for (uint c = 0u; c < 4u; c++) {
            if (4u * k + c + 1u < NW) r[4u * k + c + 1u] = v[c];
        }
    }
}

// the row's interpolation of a window (combined along the dimension before already)
void interpolate(T win[NW], out T o[8u * Q]) {
    [[unroll]] for (uint t = 0u; t < 8u * Q; t++) {
        // output 2k + j: input k + D[j] (window index k + D[j] + 1) and the next
        uint k = t / 2u;
        bool odd = (t & 1u) != 0u;
        int dj = odd ? PHASE_D1 : PHASE_D0;
        float wj = odd ? WT1 : WT0;
        T a = dj < 0 ? win[k] : win[k + 1u];
        T b = dj < 0 ? win[k + 1u] : win[k + 2u];
        o[t] = (1.0 - wj) * a + wj * b;
    }
}

// (1 - w) a + w b, elementwise: two input rows combined
void blend(T a[NW], T b[NW], float w, out T r[NW]) {
    [[unroll]] for (uint i = 0u; i < NW; i++) r[i] = (1.0 - w) * a[i] + w * b[i];
}
#endif

// stores one output row's 8 Q outputs at element sh: two u64vec4s or four T4s an input
// quad (the first nvec T4s: 2 a quad, 1 an input pair)
void store_row(uint sh, T o[8u * Q], uint nvec) {
#ifdef U64
    if (FULL != 0u) {
        if (nvec != 0u) {
            [[unroll]] for (uint k = 0u; k < Q; k++) {
                uint b = 8u * k;
                y8[(sh >> 3) + k] = vkml_u64x4(
                    BITS4(T4(o[b], o[b + 1u], o[b + 2u], o[b + 3u])),
                    BITS4(T4(o[b + 4u], o[b + 5u], o[b + 6u], o[b + 7u])));
            }
        }
        return;
    }
    if (nvec == 2u * Q && (sh & 7u) == 0u) {
        [[unroll]] for (uint k = 0u; k < Q; k++) {
            uint b = 8u * k;
            y8[(sh >> 3) + k] = vkml_u64x4(
                BITS4(T4(o[b], o[b + 1u], o[b + 2u], o[b + 3u])),
                BITS4(T4(o[b + 4u], o[b + 5u], o[b + 6u], o[b + 7u])));
        }
        return;
    }
#endif
    [[unroll]] for (uint k = 0u; k < 2u * Q; k++) {
        uint b = 4u * k;
        bool st = FULL != 0u ? nvec != 0u : k < nvec;
        if (st) y4[(sh >> 2) + k] = T4(o[b], o[b + 1u], o[b + 2u], o[b + 3u]);
    }
}

const int LAST = RANK - 1;

void main() {
    uint gx = gl_GlobalInvocationID.x;
    // x along the row (input quads), y the dimension before, z the rest (uniform per
    // workgroup); no early return (uniform loads after one become gathers on lavapipe)
    const int YDIM = RANK - 2;
    uint gy = gl_GlobalInvocationID.y;
    uint z = gl_GlobalInvocationID.z;
    bool live;
    if (SPREAD > 1u && YDIM >= 0) {
        // lane gx: row group sub of this workgroup's SPREAD, invocation gx - sub of it;
        // the flattened row group splits into z and y as the grid's z would
        uint sub = gx / SPREAD_X;
        gx -= sub * SPREAD_X;
        uint fr = gy * SPREAD + sub;
        live = gx < x_count && fr < flat_rows;
        fr = min(fr, flat_rows - 1u);
        z = divide(fr, max(YDIM, 0));
        gy = fr - z * AT(extent, max(YDIM, 0));
    } else {
        live = gx < x_count && (YDIM < 0 || gy < AT(extent, max(YDIM, 0)));
    }
    gx = min(gx, x_count - 1u);
    uint coord[8];
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) {
        gy = min(gy, AT(extent, max(YDIM, 0)) - 1u);
        coord[YDIM] = (AT(origin, YDIM) + gy) * (REP_H * ROWS_K);
    }
#ifdef PAIRS
    // input pairs (the row's units): 2 Q of them an invocation, 4 outputs (a T4) each
    const uint UNITS = 2u * Q, OUT_UNIT = 4u;
#else
    const uint UNITS = Q, OUT_UNIT = 8u;
#endif
    uint m0 = AT(origin, LAST) + gx * UNITS;      // first input unit of the row
    uint nq = phase.x;                            // input units a row
    uint count = live ? min(UNITS, nq - m0) : 0u; // units this invocation stores
    uint nvec = count * (OUT_UNIT / 4u);          // T4s it stores a row

    // the outer dimensions: one input row offset (two for linear) and a weight each;
    // PAIR: the dimension before the last is the pair's, below
#ifdef PAIR
    const int OUTER = YDIM;
#else
    const int OUTER = LAST;
#endif
    uint row0 = 0u, row1 = 0u, so = 0u;
    float wt = 0.0;
    [[unroll]] for (int d = 0; d < OUTER; d++) {
        uint i0, i1;
        float w;
        locate(d, coord[d], i0, i1, w);
        row0 += i0 * AT(in_stride, d);
        row1 += (((LIN_MASK >> d) & 1u) != 0u ? i1 : i0) * AT(in_stride, d);
        if (((LIN_MASK >> d) & 1u) != 0u) wt = w;
        so += coord[d] * AT(out_stride, d);
    }
    so += OUT_UNIT * m0;
    uint lastq = nq - 1u;
    uint hstep = YDIM >= 0 ? AT(out_stride, max(YDIM, 0)) : 0u;
    T o[8u * Q];

#if defined(NEAR)
    const uint SHIFT = OUT_UNIT == 4u ? 1u : 2u;  // elements an input unit, as a shift
    row0 >>= SHIFT;
    uint istep = YDIM >= 0 ? AT(in_stride, max(YDIM, 0)) >> SHIFT : 0u;
    for (uint i = 0u; i < ROWS_K; i++) {
        // output 2k + j reads input k (D = 0 both phases: the host's check)
        T4 r[UNITS];
        [[unroll]] for (uint k = 0u; k < UNITS; k++) r[k] = LOAD4(row0 + min(m0 + k, lastq));
        [[unroll]] for (uint t = 0u; t < 8u * Q; t++) {
            o[t] = r[t / OUT_UNIT][(t / 2u) % (OUT_UNIT / 2u)];
        }
        // to the REP_H output rows that read this input row
        for (uint h = 0u; h < REP_H; h++) store_row(so + h * hstep, o, nvec);
        row0 += istep;
        so += REP_H * hstep;
    }
#elif defined(PAIR)
    // pairs of output rows 2r, 2r + 1 (the first r = coord[YDIM] / 2): input rows
    // r + H[0] + i, clamped.  The rows a, b of a pair are the pair before's b, c: each
    // input row is loaded once an invocation (two more than its pairs), not 3 times a pair
    const int YD = max(YDIM, 0);
    int r = int(coord[YD] >> 1) + PHASE_H0;
    int last = int(AT(in_size, YD)) - 1;
    uint st = AT(in_stride, YD);
    so += coord[YD] * hstep;
    T a[NW], b[NW], c[NW], win[NW];
    load_window((row0 + uint(clamp(r, 0, last)) * st) >> 2, m0, lastq, a);
    load_window((row0 + uint(clamp(r + 1, 0, last)) * st) >> 2, m0, lastq, b);
    for (uint p = 0u; p < REP_H / 2u; p++) {
        // H[0] = H[1]: both rows of the pair interpolate a, b (c is the next pair's b)
        load_window((row0 + uint(clamp(r + int(p) + 2, 0, last)) * st) >> 2, m0, lastq, c);
        blend(a, b, WH0, win);
        interpolate(win, o);
        store_row(so, o, nvec);
        if (PHASE_H1 == PHASE_H0) {
            blend(a, b, WH1, win);
        } else {
            blend(b, c, WH1, win);
        }
        interpolate(win, o);
        store_row(so + hstep, o, nvec);
        a = b;
        b = c;
        so += 2u * hstep;
    }
#else
    // the two input rows (the dimension before the last is interpolated: the host's
    // check) combined along that dimension first: three operations an input, not an
    // output
    T a[NW], b[NW], win[NW];
    load_window(row0 >> 2, m0, lastq, a);
    load_window(row1 >> 2, m0, lastq, b);
    blend(a, b, wt, win);
    interpolate(win, o);
    store_row(so, o, nvec);
#endif
}
