#version 450
// DML_PADDING_OPERATOR_DESC, the rows path (ops/padding.py: path "rows"): for tensors whose
// innermost dimension has unit stride in the input and output, so that each output row is
// [start border | a contiguous copy of an input row | end border].  Two dispatches of this
// shader write disjoint bytes of the output:
//
// * main (EDGE = false): the 16-byte words (absolute, aligned) lying wholly inside a row's
//   copied run.  An invocation writes PER consecutive words with uvec4 stores, reading the
//   input as RGBA32UI texels (PER + 1 of them) shifted into place by the run's byte offset.
//   Measured on lavapipe: texel reads are vectorized and a uvec4 store is one per-lane loop
//   (storage-buffer loads and narrower stores are per-lane scalar loops); together they are
//   what the device's own copy reaches (bench_copy).  Rows whose outer coordinate is in a
//   constant border are the constant.
// * edge (EDGE = true): every other element of the row (the borders and the few copied
//   elements next to them that share a 16-byte word with a border), each row's in a loop
//   of one invocation, stored at their own width (a neighbouring row may share the 32-bit
//   word).
// * whole rows (ROWS_FULL, main only, no edge dispatch): where every output and input row
//   starts on a 16-byte boundary, rows end on one, and each border fits the row's first
//   or last word, the main dispatch writes all of each row's words.  A border word's
//   32-bit components are picked from the texels the invocation already holds, as
//   constants say (the same for every row), so they cost a few selects: lavapipe runs
//   every instruction for every lane (branches and loops no lane enters included), and
//   building them element by element with their own texel fetches made the kernel several
//   times slower.  x runs over (row of dimension YDIM, invocation of the row) flattened, so
//   no lane idles at a row's end.  It saves the edge dispatch: its own cost and a row's
//   scalar stores.
//
// Measured on lavapipe, which decides the shape of the code:
// * Every parameter load comes before any divergent branch: uniform-buffer and push-constant
//   loads made under a partial execution mask become 8-lane gathers (8 scalar loads with
//   bounds checks) that are not hoisted; unmasked ones are hoisted out of the lanes' loop
//   (hence the `valid` flag, not an early `return`).
// * Both sides of a divergent branch always run (masks, no jumps): no slow path in a
//   branch, the edge elements are a second dispatch.
// * Lanes are packed along local_size_x only: local_size_x = 1 runs 1 lane in 8.
//
// vkml:variant padding_rows_e1 ELEM_BYTES=1
// vkml:variant padding_rows_e2 ELEM_BYTES=2
// vkml:variant padding_rows_e4 ELEM_BYTES=4
// vkml:variant padding_rows_e8 ELEM_BYTES=8
// vkml:variant padding_rows_e1_packed ELEM_BYTES=1 PACKED=1
// vkml:variant padding_rows_e2_packed ELEM_BYTES=2 PACKED=1
// vkml:variant padding_rows_u64 ELEM_BYTES=4 U64=1
//
// U64 (devices with int64 shaders; the main dispatch only, any element width: words are
// bytes): the words go out as u64vec4 pairs (32-byte aligned) and one u64vec2 a row end
// (a pair with one word of the row), not as uvec4s.  lavapipe's store loop goes per
// component, not per byte: half the components store faster (docs/DEVELOPING.md,
// "Stores").  An invocation's
// words start on a pair: the row's first word is its k = 0 or 1 (the row's parity), so
// the border constants come twice (ROWS_BL1, ROWS_BR1: the odd rows'), and the rows
// have one word more of invocations (x_count) for the odd rows.  PER must be even.
#extension GL_EXT_control_flow_attributes : enable
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
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

layout(local_size_x_id = 0, local_size_y_id = 1) in;
layout(constant_id = 2) const int RANK = 2;      // dimensions after merging, >= 1
layout(constant_id = 3) const uint MODE = 0u;
layout(constant_id = 4) const bool EDGE = false;
// Per invocation: 16-byte words (main), or edge slots of one row (edge: the row's
// arithmetic is paid once for them all).
layout(constant_id = 5) const uint PER = 4u;
// Every padding is at most one period: one reflection folds a coordinate (no modulo).
layout(constant_id = 6) const bool SIMPLE = true;
// The byte shift between output words and input texels when the host knows it is the same
// for every row (0..15), else 16: the shift folds into constant swizzles.
layout(constant_id = 7) const uint SHIFT = 16u;
// Whole rows (main only, see the top): bit 0 on; bit 1: each row's first word holds a
// border, bit 2: its last does; bits 8 and up: which of its invocation's words is the last.
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ROWS_FULL, ROWS_BL and ROWS_BR pick the
// texel components of the border words: constant indices only once frozen.
// vkml:frozen ROWS_FULL ROWS_BL ROWS_BR
layout(constant_id = 8) const uint ROWS_FULL = 0u;
// Whole rows: the first (ROWS_BL) and last (ROWS_BR) word of every row, a byte per 32-bit
// component: bit 7 set, the constant's component; else bits 2..6 which of the invocation's
// texels t[] and bits 0..1 its component (the same for every row: input rows 16-aligned).
layout(constant_id = 9) const uint ROWS_BL = 0u;
layout(constant_id = 10) const uint ROWS_BR = 0u;
// U64, whole rows: ROWS_BL and ROWS_BR of rows starting on an odd word (the above are the
// even rows'), whose last word is its invocation's word (ROWS_FULL >> 16) & 255.
layout(constant_id = 11) const uint ROWS_BL1 = 0u;
layout(constant_id = 12) const uint ROWS_BR1 = 0u;
const bool FULL = (ROWS_FULL & 1u) != 0u;
#ifdef U64
const bool PAIRS = true;          // w0 may lie before the row's input (texel index < 0)
#else
const bool PAIRS = false;
#endif

layout(set = 0, binding = 0) uniform usamplerBuffer X;
layout(std430, set = 0, binding = 1) buffer Out4 { uvec4 y4[]; };
#ifdef U64
layout(std430, set = 0, binding = 1) buffer Out8 { u64vec4 y8[]; };
layout(std430, set = 0, binding = 1) buffer Out8h { u64vec2 y8h[]; };
#endif
#ifdef PACKED
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
#else
layout(std430, set = 0, binding = 1) buffer Out { ELEM y[]; };
#endif
layout(std140, set = 0, binding = 2) uniform Params {
    ivec4 in_size[2];             // outer dimensions (all but the innermost)
    ivec4 start[2];
    ivec4 in_stride[2];           // bytes
    uvec4 out_stride[2];          // bytes
    uvec4 value4;                 // the constant, repeated over 16 bytes
    ivec4 row;                    // bytes: start of the copied run in a row, its length,
                                  // the row's length; the last texel bound
    ivec4 inner;                  // innermost dimension: StartPadding, input size, output
                                  // size (elements)
    ivec4 slots;                  // edge slots from the left, from the right
};

// The box of (outer coordinates, word or edge slot) this dispatch covers: x along the
// last, y the one before, z the rest (divided by multiply-high, see ops/fold.py).
layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // bytes: where the bound input and output start
    uint x_count;                 // invocations along x (FULL: per row)
    uint x_magic;                 // FULL: div_magic(x_count)
    uvec4 magic[2];
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]
const uint CONSTANT = 0u, EDGE_MODE = 1u, REFLECTION = 2u, SYMMETRIC = 3u, WRAP = 4u;
const int LAST = RANK - 1;
const int YDIM = RANK - 2;

uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

// c modulo p in [0, p) for any c (p > 0), with `%` on non-negative operands only: GLSL
// leaves `%` of a negative operand undefined, and an NVIDIA GPU computed glslang's OpSMod
// of one as the unsigned remainder (-85 % 80 gave 11), where the CPU drivers gave 75.
int floor_mod(int c, int p) {
    return c >= 0 ? int(uint(c) % uint(p)) : p - 1 - int(uint(-1 - c) % uint(p));
}

// The input coordinate output coordinate c - start maps to (c inside [0, n) unchanged).
int fold_index(int c, int n) {
    if (MODE == EDGE_MODE) return clamp(c, 0, n - 1);
    if (SIMPLE) {
        if (MODE == WRAP) return c < 0 ? c + n : (c >= n ? c - n : c);
        if (MODE == REFLECTION) return c < 0 ? -c : (c >= n ? 2 * n - 2 - c : c);
        return c < 0 ? -1 - c : (c >= n ? 2 * n - 1 - c : c);        // SYMMETRIC
    }
    if (c >= 0 && c < n) return c;
    if (MODE == WRAP) return floor_mod(c, n);
    if (MODE == REFLECTION) {
        if (n == 1) return 0;     // a single element reflects onto itself (as numpy.pad)
        int p = 2 * (n - 1);
        int m = floor_mod(c, p);
        return m < n ? m : p - m;
    }
    int p = 2 * n;
    int m = floor_mod(c, p);
    return m < n ? m : p - 1 - m;
}

// Bytes b..b+15 of the 32 in (t0, t1).
uvec4 shift16(uvec4 t0, uvec4 t1, uint b) {
    uint ws = b >> 2u;
    uint bs = (b & 3u) * 8u;
    uvec4 h = (ws & 2u) != 0u ? uvec4(t0.zw, t1.xy) : t0;
    uvec2 g = (ws & 2u) != 0u ? t1.zw : t1.xy;
    uvec4 lo = (ws & 1u) != 0u ? uvec4(h.yzw, g.x) : h;
    if (bs == 0u) return lo;
    uint nx = (ws & 1u) != 0u ? g.y : g.x;
    return (lo >> bs) | (uvec4(lo.yzw, nx) << (32u - bs));
}

uint ob;                          // byte of the row's first element in the output binding
int ib;                           // byte of the row's input row in the input binding
bool inside = true;               // false: the row is in a constant border

void outer(int d, uint c) {
    ob += c * AT(out_stride, d);
    int i = int(c) - AT(start, d);
    int n = AT(in_size, d);
    if (MODE == CONSTANT) inside = inside && uint(i) < uint(n);
    else i = fold_index(i, n);
    ib += i * AT(in_stride, d);
}

uint pick(uvec4 t, uint i) { return i == 0u ? t.x : i == 1u ? t.y : i == 2u ? t.z : t.w; }

// A row's first or last word (FULL): component c from the constant or from the texels
// t[] the invocation holds, as byte c of `codes` says (see ROWS_BL).
uint border_part(uint code, uvec4 val, uint c, uvec4 tk) {
    return (code & 128u) != 0u ? val[c] : pick(tk, code & 3u);
}
#define BORDER(codes, w) [[unroll]] for (uint c = 0u; c < 4u; c++) { \
    uint code = ((codes) >> (8u * c)) & 255u; \
    w[c] = border_part(code, val, c, t[min((code >> 2u) & 31u, PER)]); }

#define OUTER(D) if (D < YDIM) { uint q = divide(z, D); outer(D, AT(origin, D) + z - q * AT(extent, D)); z = q; }

void main() {
    // main: the grid's x runs along the innermost dimension (words), y along dimension YDIM.
    // edge: the other way round, so a vector of lanes is 8 rows and a row's slots a loop
    // (lavapipe vectorizes along x only).
    const bool SWAP = EDGE && YDIM >= 0;
    uint gx = SWAP ? gl_GlobalInvocationID.y : gl_GlobalInvocationID.x;
    uint gy = SWAP ? gl_GlobalInvocationID.x : gl_GlobalInvocationID.y;
    if (FULL) {                                   // x: (row, invocation of the row)
        uint hi, lo;
        umulExtended(gx, x_magic, hi, lo);
        gy = x_count == 1u ? gx : hi;
        gx -= gy * x_count;
    }
    bool valid = gx < x_count && (YDIM < 0 ? gy == 0u : gy < AT(extent, max(YDIM, 0)));
    ivec4 rw = row, in1 = inner, sl = slots;
    uvec4 val = value4;
    ob = out_base;
    ib = int(in_base);
    if (YDIM >= 0) outer(max(YDIM, 0), AT(origin, max(YDIM, 0)) + gy);
    uint z = gl_GlobalInvocationID.z;
    OUTER(5) OUTER(4) OUTER(3) OUTER(2) OUTER(1) OUTER(0)
    uint run = ob + uint(rw.x);                   // the copied run: [run, run + rw.y)
    uint first = (run + 15u) >> 4u;               // its whole 16-byte words: [first, endw)
    uint endw = (run + uint(rw.y)) >> 4u;
    uint j = AT(origin, LAST) + gx * PER;
    if (!EDGE) {
        uint lo = FULL ? ob >> 4u : first;        // the row's words: [lo, wend)
        uint wend = FULL ? (ob + uint(rw.z)) >> 4u : endw;
#ifdef U64
        uint w0 = (lo & ~1u) + j;                 // pairs: 32-byte aligned
#else
        uint w0 = lo + j;
#endif
        int a = ib + int(w0 * 16u - run);         // input byte of word w0's first byte
        int q = a >> 4;
        uint b = SHIFT < 16u ? SHIFT : uint(a) & 15u;
        uvec4 t[PER + 1u];
        [[unroll]] for (uint k = 0u; k <= PER; k++)
            t[k] = texelFetch(X, FULL || PAIRS ? clamp(q + int(k), 0, rw.w) : min(q + int(k), rw.w));
#ifdef U64
        uvec4 ws[PER];
        bool ok[PER];
#endif
        [[unroll]] for (uint k = 0u; k < PER; k++) {
            uint wk = w0 + k;
            uvec4 w = shift16(t[k], t[k + 1u], b);
            uvec4 bw = w;
            if ((ROWS_FULL & 2u) != 0u && k == 0u) { BORDER(ROWS_BL, bw) if (wk == lo) w = bw; }
            if ((ROWS_FULL & 4u) != 0u && k == ((ROWS_FULL >> 8u) & 255u)) {
                BORDER(ROWS_BR, bw) if (wk + 1u == wend) w = bw;
            }
#ifdef U64
            if ((ROWS_FULL & 2u) != 0u && k == 1u) { BORDER(ROWS_BL1, bw) if (wk == lo) w = bw; }
            if ((ROWS_FULL & 4u) != 0u && k == ((ROWS_FULL >> 16u) & 255u)) {
                BORDER(ROWS_BR1, bw) if (wk + 1u == wend) w = bw;
            }
#endif
            if (MODE == CONSTANT && !inside) w = val;
#ifdef U64
            ws[k] = w;
            ok[k] = valid && wk >= lo && wk < wend;
#else
            if (valid && wk < wend) y4[wk] = w;
#endif
        }
#ifdef U64
        // whole pairs as u64vec4s; a pair with one word of the row (its first word on an
        // odd one, or its last on an even one) as one u64vec2 (one an invocation: the host
        // keeps rows longer than an invocation's words)
        uvec4 sw = ws[0];
        uint sa = w0;
        bool single = false;
        [[unroll]] for (uint i = 0u; i < PER / 2u; i++) {
            uvec4 u0 = ws[2u * i], u1 = ws[2u * i + 1u];
            bool o0 = ok[2u * i], o1 = ok[2u * i + 1u];
            if (o0 && o1)
                y8[(w0 >> 1u) + i] = vkml_u64x4(u0, u1);
            single = single || (o0 != o1);
            sw = o0 && !o1 ? u0 : (o1 && !o0 ? u1 : sw);
            sa = o0 && !o1 ? w0 + 2u * i : (o1 && !o0 ? w0 + 2u * i + 1u : sa);
        }
        if (single) y8h[sa] = vkml_u64x2(sw);
#endif
        return;
    }
    // Edge slots j..j+PER-1: element j of the row, or (past the left slots) one of its
    // last ones.
    int left = int(first * 16u - ob) / ELEM_BYTES;               // elements before word first
    int right = int(ob + uint(rw.z) - endw * 16u) / ELEM_BYTES;  // elements from word endw
    [[unroll]] for (uint k = 0u; k < PER; k++) {
        int jk = int(j + k);
        bool from_left = jk < sl.x;
        int c = from_left ? jk : in1.z - sl.y + (jk - sl.x);
        bool mine = valid && jk < sl.x + sl.y && (from_left ? c < left : c >= in1.z - right);
        int cl = c - in1.x;
        bool value = MODE == CONSTANT && (!inside || uint(cl) >= uint(in1.y));
        int i = MODE == CONSTANT ? clamp(cl, 0, in1.y - 1) : fold_index(cl, in1.y);
        int a = ib + i * ELEM_BYTES;
        uvec4 tx = texelFetch(X, min(a >> 4, rw.w));
        uint wi = (uint(a) >> 2u) & 3u;
        uint v0 = wi == 0u ? tx.x : wi == 1u ? tx.y : wi == 2u ? tx.z : tx.w;
        uint o = (ob + uint(c * ELEM_BYTES)) / ELEM_BYTES;
        if (mine) {
#if ELEM_BYTES == 8
            y[o] = value ? val.xy : uvec2(v0, wi == 0u ? tx.y : tx.w);
#else
            uint v = value ? val.x : v0 >> ((uint(a) & 3u) * 8u);
#if defined(PACKED) && ELEM_BYTES == 2
            VKML_ST16(y, o, v)
#elif defined(PACKED)
            VKML_ST8(y, o, v)
#else
            y[o] = ELEM(v);
#endif
#endif
        }
    }
}
