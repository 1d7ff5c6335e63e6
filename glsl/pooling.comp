#version 450
// DML_MAX_POOLING(1,2)_OPERATOR_DESC and DML_AVERAGE_POOLING(1)_OPERATOR_DESC: one
// invocation per output element (n, c, o[0..D-1]) visits its (dilated) window
//     p[d] = o[d] * Strides[d] + k[d] * Dilations[d] - StartPadding[d]
// in row-major window order, skipping padded positions (outside the input):
//   MODE 0 (max): padded cells never win (they are -inf, as in ONNX and PyTorch); the
//          first maximum wins a tie (the page's rule for OutputIndicesTensor) and a NaN
//          beats every number.  INDICES 1/2: its index as a UINT32 / UINT64 (word pair),
//          the element's position in the input read as a packed 1-D array.  A window
//          wholly in the padding gives the lowest value and index 0.
//   MODE 1 (average, float types): the float32 sum over the cells in the input divided
//          by `divisor` (INCLUDE_PADDING: the whole window) or by their count (0 when
//          there are none).
//
// vkml:variant pooling_f32 F32=1
// vkml:variant pooling_f32_texel F32=1 TEXEL=1
// vkml:variant pooling_f16 F16=1
// vkml:variant pooling_f16_packed F16_PACKED=1
// vkml:variant pooling_i8 INT_BITS=8 SIGNED=1
// vkml:variant pooling_u8 INT_BITS=8
// vkml:variant pooling_i16 INT_BITS=16 SIGNED=1
// vkml:variant pooling_u16 INT_BITS=16
// vkml:variant pooling_i32 INT_BITS=32 SIGNED=1
// vkml:variant pooling_u32 INT_BITS=32
// vkml:variant pooling_i64 INT64=1 SIGNED=1
// vkml:variant pooling_u64 INT64=1
#extension GL_EXT_control_flow_attributes : enable
#include "vkml_elem.glsl"

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
layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // per output dimension
    uvec4 in_stride[2];           // per input dimension
    uvec4 in_size;                // spatial sizes
    ivec4 start;                  // StartPadding (after safe_geometry)
    uvec4 in_packed[2];           // the input's packed strides (the indices' numbering)
    uvec4 idx_stride[2];          // OutputIndicesTensor's strides
    uvec4 win;                    // WindowSize, Strides, Dilations (1 beyond the
    uvec4 stride;                 // spatial dimensions): parameters, not constants, so
    uvec4 dil;                    // that one pipeline serves every window (unrolled
                                  // windows took lavapipe 1-2 s to compile, each)
    float divisor;                // INCLUDE_PADDING: the window's element count
    uint pad0, pad1, pad2;
};
// OutputIndicesTensor in 32-bit words, bound whole (another buffer when INDICES is 0)
layout(std430, set = 0, binding = 3) buffer Idx { uint yi[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 or 5: N, C, 2 or 3 spatial
layout(constant_id = 2) const int XDIMS = 1;     // trailing dimensions the grid's x covers
layout(constant_id = 24) const int MODE = 0;              // 0 max, 1 average
layout(constant_id = 25) const bool INCLUDE_PADDING = false;
layout(constant_id = 26) const int INDICES = 0;           // 0 none, 1 UINT32, 2 UINT64

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // element index of the first bound element
    uint x_count;                 // invocations along x
    uvec4 magic[2];               // ceil(2^32 / extent): see divide()
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

// a / extent[d] for a < 2^16 (the host keeps grid coordinates below it): the high word
// of a * ceil(2^32 / extent); lavapipe runs an integer division one lane at a time.
uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

const int D = RANK - 2;
const int LAST = RANK - 1;
uint coord[8];

void main() {
    uint gx = gl_GlobalInvocationID.x;
    const int YDIM = RANK - XDIMS - 1;
    // a flag, not an early return: uniform loads after a divergent return are gathers
    bool live = gx < x_count && (YDIM < 0 || gl_GlobalInvocationID.y < AT(extent, YDIM));
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
    uint base = coord[0] * in_stride[0].x + coord[1] * in_stride[0].y - in_base;
    uint lbase = coord[0] * in_packed[0].x + coord[1] * in_packed[0].y;
    int p0 = int(coord[2] * stride.x) - start.x;
    int p1 = int(coord[3] * stride.y) - start.y;
    int p2 = D == 3 ? int(coord[4] * stride.z) - start.z : 0;

    VAL best = ELOWEST;
    bool found = false;
    uint best_idx = 0u;
    float sum = 0.0;
    uint count = 0u;
    for (uint a = 0u; a < win.x; a++) {
        int i0 = p0 + int(a * dil.x);
        bool ok0 = live && uint(i0) < in_size.x;
        for (uint b = 0u; b < win.y; b++) {
            int i1 = p1 + int(b * dil.y);
            bool ok1 = ok0 && uint(i1) < in_size.y;
            for (uint c = 0u; c < win.z; c++) {
                int i2 = p2 + int(c * dil.z);
                bool ok = ok1 && (D < 3 || uint(i2) < in_size.z);
                uint off = base + uint(i0) * AT(in_stride, 2) + uint(i1) * AT(in_stride, 3);
                if (D == 3) off += uint(i2) * AT(in_stride, 4);
                VAL v = XLOAD(ok ? off : 0u);
                if (MODE == 0) {
                    bool take = ok && (!found || EGT(v, best));
                    uint li = lbase + uint(i0) * AT(in_packed, 2) + uint(i1) * AT(in_packed, 3);
                    if (D == 3) li += uint(i2) * AT(in_packed, 4);
                    best = take ? v : best;
                    best_idx = take ? li : best_idx;
                    found = found || ok;
                }
#ifdef E_FLOAT
                if (MODE == 1) {
                    sum += ok ? v : 0.0;
                    count += ok ? 1u : 0u;
                }
#endif
            }
        }
    }
    if (!live) return;
    uint o = 0u, io = 0u;
    [[unroll]] for (int d = 0; d < RANK; d++) {
        o += coord[d] * AT(out_stride, d);
        io += coord[d] * AT(idx_stride, d);
    }
    o -= out_base;
#ifdef E_FLOAT
    if (MODE == 1) {
        float r = INCLUDE_PADDING ? sum / divisor : (count == 0u ? 0.0 : sum / float(count));
        FSTORE(y, o, r);
        return;
    }
#endif
    ESTORE(y, o, best);
    if (INDICES == 1) yi[io] = best_idx;
    if (INDICES == 2) {
        yi[2u * io] = best_idx;
        yi[2u * io + 1u] = 0u;    // a bound input has fewer than 2^32 elements
    }
}
