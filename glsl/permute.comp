#version 450
// Strided copies of 32-bit words that the element-wise family's strided path would move
// one element per lane and store (vkml/ops/permute.py): a transpose (IDENTITY with
// permuted strides) and a slice with a step along rows (SLICE1).  Bits are moved, so one
// text serves every type of 32-bit elements.
//
// permute_tile_texel4 / _ssbo4 (TILE): the output contiguous along the box's last
//   dimension p, the input along the one before, q; p and q counted in quads (4 words).
//   An invocation reads V tiles of 4 x 4 words, each as four uvec4s along q (an RGBA32UI
//   texel, which lavapipe vectorizes, or a uvec4 storage load), transposes them in
//   registers and stores four uvec4s along p per tile: no shared memory and no barrier
//   (lavapipe and SwiftShader run a workgroup's lanes as one SIMD loop, so a barrier
//   splits the kernel in two), every load and store a whole uvec4.
// permute_rows_texel / _ssbo (ROWS): the output contiguous along the last dimension,
//   the input at any (signed) element stride along it: V words of an output row an
//   invocation, each read by a scalar fetch, stored as uvec4s where every output row
//   starts on a whole uvec4 (VEC4), else word by word.  REP > 1 (a nearest resample by
//   an integer factor along rows, vkml/ops/resample.py): output word c of a row reads
//   the row's input element c / REP (the last dimension's input stride is per element).
//   The QUAD variants (rows _texel4 / _ssbo4: input rows contiguous, on whole uvec4s and
//   of whole uvec4s; V a multiple of 4 * REP) read a row's input as uvec4s, each
//   giving 4 * REP output words: scalar fetches held the rows kernel at a quarter of a
//   flat copy's speed on lavapipe.
// permute_span_texel4 / _ssbo4 (SPAN): the rows kind where the input's rows are read
//   as uvec4s at a small positive step: output word j of a row reads input word
//   SPAN_SHIFT + j * SPAN_STEP of the row's first uvec4 (a crop of rows that start at a
//   constant offset within a uvec4, or a stride-2 slice: two uvec4 fetches give four
//   outputs), so no scalar fetch and no per-word index arithmetic; every row's first
//   word sits SPAN_SHIFT words into a uvec4 (outer input strides and V * SPAN_STEP
//   multiples of 4).  Only the uvec4s holding a live output are read.  The grid's x runs
//   over the rows and the V-word chunks of each (magic[LAST] divides by the chunks a
//   row), y the dimension before the rows: a row's end idles no lane but its last
//   invocation's tail, whatever the row's length (x along one row idled the rest of
//   lavapipe's 8-lane SIMD rows past a row's end), so V can be 8, 16 or 32, whole
//   u64vec4 stores (the _u64 variants where every output row starts on 8 words: the
//   host's rule, so no lane tests it); a row's partial last invocation loops word by word.
// permute_tile_r4_* / permute_span_r4_*_v8/_v16/_v32 (R4): the TILE and SPAN kernels for
//   a box of at most four dimensions (the host pads it to four), V compile-time (VF), no
//   coordinate array and no loop over RANK: SwiftShader unrolls no loop bounded by a
//   specialization constant, frozen or not, and keeps an array such a loop indexes in
//   memory (docs/DEVELOPING.md, "Facts about SwiftShader").  The span's step and shift
//   select one of eight copies of its register code (a branch on frozen constants, folded
//   to one), each with the uvec4 and component indices compile-time.
// permute_tsm_texel / _ssbo (TSM): the tile kind's copy (box of four dimensions, p and q
//   in words) through a 32 x 32-word shared-memory tile: a 32 x 8 workgroup reads the
//   tile's rows along q (scalar loads, neighbouring lanes on neighbouring words), and
//   after a barrier writes its columns as rows along p.  A candidate beside the register
//   tiles for devices that run a barrier cheaply (the tuner times it; the CPU drivers'
//   SIMD loop is split in two by it).
// *_u64 (devices with int64 shaders, where store_width's timing says so): a full
//   invocation's stores as u64vec4s, eight words each (two tiles' rows, or eight words of
//   a row) where its output offset allows: lavapipe stores a vector's components one by
//   one, so 64-bit components carry twice the bytes for the same cost.
// Grid (but SPAN's) as glsl/element_wise.comp's strided variant with XDIMS = 1: x along
// the last dimension (V units an invocation), y the one before, z the rest (uniform per
// workgroup).
// Strides and bases are modulo 2^32: a negative stride is its two's complement.
//
// vkml:variant permute_tile_texel4 TILE=1 TEXEL=1
// vkml:variant permute_tile_ssbo4 TILE=1
// vkml:variant permute_rows_texel ROWS=1 TEXEL=1
// vkml:variant permute_rows_ssbo ROWS=1
// vkml:variant permute_tile_texel4_u64 TILE=1 TEXEL=1 U64=1
// vkml:variant permute_tile_ssbo4_u64 TILE=1 U64=1
// vkml:variant permute_rows_texel_u64 ROWS=1 TEXEL=1 U64=1
// vkml:variant permute_rows_ssbo_u64 ROWS=1 U64=1
// vkml:variant permute_rows_texel4 ROWS=1 QUAD=1 TEXEL=1
// vkml:variant permute_rows_ssbo4 ROWS=1 QUAD=1
// vkml:variant permute_rows_texel4_u64 ROWS=1 QUAD=1 TEXEL=1 U64=1
// vkml:variant permute_rows_ssbo4_u64 ROWS=1 QUAD=1 U64=1
// vkml:variant permute_span_texel4 ROWS=1 SPAN=1 TEXEL=1
// vkml:variant permute_span_ssbo4 ROWS=1 SPAN=1
// vkml:variant permute_span_texel4_u64 ROWS=1 SPAN=1 TEXEL=1 U64=1
// vkml:variant permute_span_ssbo4_u64 ROWS=1 SPAN=1 U64=1
// vkml:variant permute_tsm_texel TSM=1 R4=1 VF=1 TEXEL=1
// vkml:variant permute_tsm_ssbo TSM=1 R4=1 VF=1
// vkml:variant permute_tile_r4_texel4 TILE=1 R4=1 VF=2 TEXEL=1
// vkml:variant permute_tile_r4_texel4_u64 TILE=1 R4=1 VF=2 TEXEL=1 U64=1
// vkml:variant permute_tile_r4_ssbo4 TILE=1 R4=1 VF=2
// vkml:variant permute_tile_r4_ssbo4_u64 TILE=1 R4=1 VF=2 U64=1
// vkml:variant permute_span_r4_texel4_v8 ROWS=1 SPAN=1 R4=1 VF=8 TEXEL=1
// vkml:variant permute_span_r4_texel4_v8_u64 ROWS=1 SPAN=1 R4=1 VF=8 TEXEL=1 U64=1
// vkml:variant permute_span_r4_texel4_v16 ROWS=1 SPAN=1 R4=1 VF=16 TEXEL=1
// vkml:variant permute_span_r4_texel4_v16_u64 ROWS=1 SPAN=1 R4=1 VF=16 TEXEL=1 U64=1
// vkml:variant permute_span_r4_texel4_v32 ROWS=1 SPAN=1 R4=1 VF=32 TEXEL=1
// vkml:variant permute_span_r4_texel4_v32_u64 ROWS=1 SPAN=1 R4=1 VF=32 TEXEL=1 U64=1
// vkml:variant permute_span_r4_ssbo4_v8 ROWS=1 SPAN=1 R4=1 VF=8
// vkml:variant permute_span_r4_ssbo4_v8_u64 ROWS=1 SPAN=1 R4=1 VF=8 U64=1
// vkml:variant permute_span_r4_ssbo4_v16 ROWS=1 SPAN=1 R4=1 VF=16
// vkml:variant permute_span_r4_ssbo4_v16_u64 ROWS=1 SPAN=1 R4=1 VF=16 U64=1
// vkml:variant permute_span_r4_ssbo4_v32 ROWS=1 SPAN=1 R4=1 VF=32
// vkml:variant permute_span_r4_ssbo4_v32_u64 ROWS=1 SPAN=1 R4=1 VF=32 U64=1
#extension GL_EXT_control_flow_attributes : enable

#if (defined(TILE) || defined(QUAD) || defined(SPAN)) && defined(TEXEL)
layout(set = 0, binding = 0) uniform usamplerBuffer Xt;
#define LOAD4(q) texelFetch(Xt, int(q))
#elif defined(TILE) || defined(QUAD) || defined(SPAN)
layout(std430, set = 0, binding = 0) readonly buffer X4 { uvec4 x4[]; };
#define LOAD4(q) x4[q]
#elif defined(TEXEL)
layout(set = 0, binding = 0) uniform usamplerBuffer Xt;
#define LOAD1(w) texelFetch(Xt, int(w)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer X { uint x[]; };
#define LOAD1(w) x[w]
#endif
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { uvec4 y4[]; };
#ifdef U64
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
layout(std430, set = 0, binding = 1) buffer Out8 { u64vec4 y8[]; };
const bool WIDE = true;
#else
const bool WIDE = false;
#define y8 y4
#define vkml_u64x4(a, b) (a)
#endif

layout(local_size_x_id = 0, local_size_y_id = 23) in;
// units of the last dimension an invocation (TILE: tiles, ROWS: words); compile-time
// bounds so the loops unroll into registers
#ifdef R4
const int RANK = 4;
const uint V = VF;
#else
layout(constant_id = 1) const int RANK = 4;      // 2 to 8 dimensions (TILE), 1 to 8 (ROWS)
layout(constant_id = 21) const uint V = 2u;
#endif
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: VEC4 selects the rows' store code; SPAN_STEP
// and SPAN_SHIFT pick the register components the span rows read: constant indices only once
// frozen.
// vkml:frozen VEC4 SPAN_STEP SPAN_SHIFT
layout(constant_id = 29) const bool VEC4 = false;   // ROWS: output rows on whole uvec4s
layout(constant_id = 30) const uint REP = 1u;       // ROWS: outputs per input element
layout(constant_id = 31) const uint SPAN_STEP = 1u;  // SPAN: input words per output word
layout(constant_id = 32) const uint SPAN_SHIFT = 0u; // SPAN: a row's first word in its uvec4

layout(std140, set = 0, binding = 2) uniform Params {
    // per dimension; TILE: input in uvec4s per unit of the coordinate (a quad of q is
    // 1, a quad of p four rows of p), output in uvec4s (a quad of p is 1, a quad of q
    // four rows of q); ROWS: words
    uvec4 in_stride[2];
    uvec4 out_stride[2];
};

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // the bindings' first unit (uvec4s for TILE, words else)
    uint x_count;                 // invocations along x
    uvec4 magic[2];               // ceil(2^32 / extent): see divide(); SPAN: [LAST] by chunks
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

// a / extent[d] for a < 2^16 (grid.py keeps grid coordinates below it)
uint divide(uint q, int d) {
    uint hi, lo;
    umulExtended(q, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? q : hi;
}

const int LAST = RANK - 1;

#ifdef TSM
const uint TS = 32u, TY = 8u;       // the tile's words a side; the workgroup's rows (host)
shared uint tile[TS][TS + 1u];      // a column's words on distinct banks

void main() {
    uint z = gl_WorkGroupID.z, zq = divide(z, 1);
    uvec2 o = origin[0].xy + uvec2(zq, z - zq * extent[0].y);
    uint bi = o.x * in_stride[0].x + o.y * in_stride[0].y - in_base;
    uint bo = o.x * out_stride[0].x + o.y * out_stride[0].y - out_base;
    uint p0 = origin[0].w + gl_WorkGroupID.x * TS, q0 = origin[0].z + gl_WorkGroupID.y * TS;
    uint pe = origin[0].w + extent[0].w, qe = origin[0].z + extent[0].z;
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    [[unroll]] for (uint i = 0u; i < TS; i += TY) {     // lanes along q: the input's rows
        uint p = p0 + ty + i, q = q0 + tx;
        bool inside = p < pe && q < qe;
        if (inside) tile[ty + i][tx] = LOAD1(bi + q * in_stride[0].z + p * in_stride[0].w);
    }
    barrier();
    [[unroll]] for (uint i = 0u; i < TS; i += TY) {     // lanes along p: the output's rows
        uint q = q0 + ty + i, p = p0 + tx;
        bool inside = p < pe && q < qe;
        if (inside) y[bo + q * out_stride[0].z + p * out_stride[0].w] = tile[tx][ty + i];
    }
}
#else
#ifdef R4
// box_coords for the four-dimension box (R4), as a uvec4: the same grid, the z
// dimensions' division written out (TILE: z over dimensions 0 and 1; SPAN: z is 0, y 1).
uint box4(out uvec4 c) {
    uint gx = gl_GlobalInvocationID.x, y = gl_GlobalInvocationID.y;
    uint z = gl_GlobalInvocationID.z;
#ifdef SPAN
    // gx / chunks by magic[LAST] as box_coords's SPAN grid
    uint chunks = (extent[0].w + V - 1u) / V, hi, lo;
    umulExtended(gx, magic[0].w, hi, lo);
    uint row = chunks == 1u ? gx : hi;
    bool live = gx < x_count && y < extent[0].y;
    c = origin[0] + uvec4(z, y, row, (gx - row * chunks) * V);
#else
    uint q = divide(z, 1);
    bool live = gx < x_count && y < extent[0].z;
    c = origin[0] + uvec4(q, z - q * extent[0].y, y, gx * V);
#endif
    uint end = origin[0].w + extent[0].w;
    bool inside = live && c.w < end;
    return uint(inside) * min(V, end - c.w);
}
#endif

// The box coordinates of this invocation's first unit and how many of its V it has.
uint box_coords(out uint coord[8]) {
    uint gx = gl_GlobalInvocationID.x;
#ifdef SPAN
    const int YDIM = RANK - 3;      // x runs over the rows too (RANK >= 2)
#else
    const int YDIM = RANK - 2;
#endif
    bool live = gx < x_count && (YDIM < 0 || gl_GlobalInvocationID.y < AT(extent, YDIM));
    uint z = gl_GlobalInvocationID.z;
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) coord[YDIM] = AT(origin, YDIM) + gl_GlobalInvocationID.y;
#ifdef SPAN
    // gx / chunks, chunks = the row's invocations: a multiply-high by magic[LAST]
    // (ceil(2^32 / chunks), 0 for one chunk; gx < 2^16: grid.py)
    uint chunks = (AT(extent, LAST) + V - 1u) / V, hi, lo;
    umulExtended(gx, AT(magic, LAST), hi, lo);
    uint row = chunks == 1u ? gx : hi;
    coord[LAST - 1] = AT(origin, LAST - 1) + row;
    coord[LAST] = AT(origin, LAST) + (gx - row * chunks) * V;
#else
    coord[LAST] = AT(origin, LAST) + gx * V;
#endif
    uint end = AT(origin, LAST) + AT(extent, LAST);
    return live && coord[LAST] < end ? min(V, end - coord[LAST]) : 0u;
}

void main() {
#ifdef R4
    uvec4 at;
    uint count = box4(at);
    uvec4 ti = at * in_stride[0], to = at * out_stride[0];
    uint si = ti.x + ti.y + ti.z + ti.w - in_base, so = to.x + to.y + to.z + to.w - out_base;
#else
    uint coord[8];
    uint count = box_coords(coord);
    uint si = 0u, so = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        si += (d == LAST ? coord[d] / REP : coord[d]) * AT(in_stride, d);
        so += coord[d] * AT(out_stride, d);
    }
    si -= in_base;
    so -= out_base;
#endif
#ifdef TILE
    // a quad of p; one row of p, one row of q (signed: a stride may be negative)
    uint ip = AT(in_stride, LAST), row_in = uint(int(ip) >> 2);
    uint row_out = uint(int(AT(out_stride, LAST - 1)) >> 2);
    uvec4 c[V][4];                                  // c[j][k]: tile j's row k of q
    [[unroll]] for (uint j = 0u; j < V; j++) {
        if (j < count) {
            uint t = si + j * ip;
            uvec4 r0 = LOAD4(t), r1 = LOAD4(t + row_in), r2 = LOAD4(t + 2u * row_in),
                  r3 = LOAD4(t + 3u * row_in);
            c[j][0] = uvec4(r0.x, r1.x, r2.x, r3.x);
            c[j][1] = uvec4(r0.y, r1.y, r2.y, r3.y);
            c[j][2] = uvec4(r0.z, r1.z, r2.z, r3.z);
            c[j][3] = uvec4(r0.w, r1.w, r2.w, r3.w);
        }
    }
    // two neighbouring tiles' rows are eight words of an output row
    if (WIDE && V % 2u == 0u && count == V && ((so | row_out) & 1u) == 0u) {
        [[unroll]] for (uint j = 0u; j < V; j += 2u) {
            [[unroll]] for (uint k = 0u; k < 4u; k++) {
                y8[(so + j + k * row_out) >> 1] = vkml_u64x4(c[j][k], c[j + 1u][k]);
            }
        }
    } else {
        [[unroll]] for (uint j = 0u; j < V; j++) {
            if (j < count) {
                [[unroll]] for (uint k = 0u; k < 4u; k++) y4[so + j + k * row_out] = c[j][k];
            }
        }
    }
#elif defined(SPAN)
// w[0..V) from the uvec4s spanning a full invocation's input words, held in registers
// (constant indices where STEP and SHIFT are compile-time or frozen)
#define SPAN_WORDS(STEP, SHIFT) { \
        const uint NQ = ((SHIFT) + (V - 1u) * (STEP)) / 4u + 1u; \
        uvec4 r[NQ]; \
        [[unroll]] for (uint k = 0u; k < NQ; k++) r[k] = LOAD4(q0 + k); \
        [[unroll]] for (uint j = 0u; j < V; j++) { \
            const uint e = (SHIFT) + j * (STEP); \
            w[j] = r[e >> 2][e & 3u]; \
        } }
    uint q0 = (si - SPAN_SHIFT) >> 2;
    if (count == V) {
        // the uvec4s spanning the V outputs' input words, held in registers (constant
        // indices); the store form is the host's (uniform): lavapipe runs every branch
        // on a lane's value in every SIMD group, taken or not
        uint w[V];
#ifdef R4
        const uint SPAN_CASE = 4u * SPAN_STEP + SPAN_SHIFT;   // folded once frozen
        if (SPAN_CASE == 4u) SPAN_WORDS(1u, 0u)
        else if (SPAN_CASE == 5u) SPAN_WORDS(1u, 1u)
        else if (SPAN_CASE == 6u) SPAN_WORDS(1u, 2u)
        else if (SPAN_CASE == 7u) SPAN_WORDS(1u, 3u)
        else if (SPAN_CASE == 8u) SPAN_WORDS(2u, 0u)
        else if (SPAN_CASE == 9u) SPAN_WORDS(2u, 1u)
        else if (SPAN_CASE == 10u) SPAN_WORDS(2u, 2u)
        else SPAN_WORDS(2u, 3u)
#else
        SPAN_WORDS(SPAN_STEP, SPAN_SHIFT)
#endif
        if (WIDE) {                                 // so a multiple of 8 words (host)
            [[unroll]] for (uint k = 0u; k < V / 8u; k++) {
                uint b = 8u * k;
                y8[(so >> 3) + k] = vkml_u64x4(uvec4(w[b], w[b + 1u], w[b + 2u], w[b + 3u]),
                                               uvec4(w[b + 4u], w[b + 5u], w[b + 6u], w[b + 7u]));
            }
        } else if (VEC4) {                          // so a multiple of 4 words
            [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
                y4[(so >> 2) + k] = uvec4(w[4u * k], w[4u * k + 1u], w[4u * k + 2u],
                                          w[4u * k + 3u]);
            }
        } else {
            [[unroll]] for (uint j = 0u; j < V; j++) y[so + j] = w[j];
        }
    } else {
        // a row's last, partial invocation: a loop, not unrolled (an unrolled tail's
        // masked loads and stores would run in every SIMD group on lavapipe)
        [[dont_unroll]] for (uint j = 0u; j < count; j++) {
            uint e = SPAN_SHIFT + j * SPAN_STEP;
            y[so + j] = LOAD4(q0 + (e >> 2))[e & 3u];
        }
    }
#else
    uint w[V];
#ifdef QUAD
    // si: a whole uvec4 (c0 a multiple of V, so c0 / REP one of 4)
    [[unroll]] for (uint k = 0u; k < V / (4u * REP); k++) {
        if (4u * REP * k < count) {
            uvec4 r = LOAD4((si >> 2) + k);
            [[unroll]] for (uint j = 0u; j < 4u * REP; j++) w[4u * REP * k + j] = r[j / REP];
        }
    }
#else
    uint step = AT(in_stride, LAST);
    [[unroll]] for (uint j = 0u; j < V; j++) {
        // (c0 + j) / REP - c0 / REP: j / REP, folded, where REP divides V
        uint c0 = coord[LAST];
        if (j < count) w[j] = LOAD1(si + ((c0 + j) / REP - c0 / REP) * step);
    }
#endif
    if (WIDE && V % 8u == 0u && count == V && (so & 7u) == 0u) {
        [[unroll]] for (uint k = 0u; k < V / 8u; k++) {
            uint b = 8u * k;
            y8[(so >> 3) + k] = vkml_u64x4(uvec4(w[b], w[b + 1u], w[b + 2u], w[b + 3u]),
                                           uvec4(w[b + 4u], w[b + 5u], w[b + 6u], w[b + 7u]));
        }
    } else if (VEC4 && count == V) {                // so a multiple of 4 words
        [[unroll]] for (uint k = 0u; k < V / 4u; k++) {
            y4[(so >> 2) + k] = uvec4(w[4u * k], w[4u * k + 1u], w[4u * k + 2u], w[4u * k + 3u]);
        }
    } else {
        [[unroll]] for (uint j = 0u; j < V; j++) {
            if (j < count) y[so + j] = w[j];
        }
    }
#endif
}
#endif
