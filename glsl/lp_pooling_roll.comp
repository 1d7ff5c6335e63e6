#version 450
// LP pooling (see glsl/lp_pooling.comp for the operator) written for drivers that neither
// fold specialization constants nor skip the blocks no lane takes (SwiftShader; see
// docs/DEVELOPING.md): the window loops stay rolled, nothing is held in local arrays,
// an invocation computes 4 neighbouring outputs of the last dimension as one vec4 (its
// index arithmetic and outer-row checks shared by the 4), and the grid's x runs along the
// last dimension only (XDIMS = 1).
//
// One pass sums |x| (it carries NaN), x^2 and the largest |x| = m.  P = 1 is the sum of
// |x|; P = 2 the sqrt of the sum of squares, exact wherever that sum neither overflows nor
// underflows float32 (m in [2^-50, 2^63) and the sum finite); every other P, and a P = 2
// output whose m lies outside that range or whose sum overflowed, is summed again scaled
// by m (as lp_pooling.comp) -- in a loop that runs only while some lane needs it (a loop
// is the one construct SwiftShader skips when no lane enters it).
//
// TILE ("tile"): the workgroup first copies the input its outputs read (with the halo)
// into shared memory, each element once (rows along y, columns along x), then computes
// from there; the grid's workgroups are tiles of LOCAL_SIZE_Y rows x 4 LOCAL_SIZE_X
// columns of one output plane; the host keeps the tile within maxComputeSharedMemorySize.
//
// vkml:variant lp_pooling_f32_roll F32=1
// vkml:variant lp_pooling_f32_tile F32=1 TILE=1
#include "vkml_float.glsl"

layout(std430, set = 0, binding = 0) readonly buffer In { float x[]; };
layout(std430, set = 0, binding = 1) buffer Out { float y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 or 5: N, C, 2 or 3 spatial
layout(constant_id = 2) const int XDIMS = 1;     // always 1 here
#define VKML_WINDOW_DIMS 3
#include "vkml_window.glsl"
layout(constant_id = 21) const uint V = 4u;      // outputs per invocation: 4 (1 on short rows)
layout(constant_id = 22) const bool VEC_STORE = false;   // the 4 stored as one vec4
layout(constant_id = 24) const uint P = 2u;
#ifdef TILE
layout(constant_id = 25) const uint TILE_SIZE = 1u;   // floats of the tile (host: WA*HB*IL)
shared float tile[TILE_SIZE];
#endif

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
// the spatial dimensions as A (3-D only; 1 wide in 2-D), B and L (the last)
const uint WA = R5 ? W0 : 1u, SA = R5 ? S0 : 1u, LA = R5 ? L0 : 1u;
const uint WB = R5 ? W1 : W0, SB = R5 ? S1 : S0, LB = R5 ? L1 : L0;
// 2^-50 and 2^63 below
const uint WL = R5 ? W2 : W1, SL = R5 ? S2 : S1, LL = R5 ? L2 : L1;

// a^P for 0 <= a <= 1 by repeated squaring (a rolled loop over P's bits)
float pow_p(float a) {
    float r = 1.0, b = a;
    for (uint q = P; q != 0u; q >>= 1) {
        r = (q & 1u) != 0u ? r * b : r;
        b *= b;
    }
    return r;
}

uint sL, tL;
ivec4 iL0;
#ifdef TILE
uint tile_col;      // this lane's first column in the tile
uint hb, il_n;      // tile rows per A position and columns
#define ROW(ka, kb, ia, ib) (((ka) * hb + lrow + (kb) * LB) * il_n)
uint lrow;
// the 4 inputs of window column kl for the 4 outputs (tile: padding stored as 0)
vec4 window_values(bool okr, uint row, uint kl) {
    uint t = row + tile_col + kl * LL;
    return vec4(tile[t], tile[t + SL], tile[t + 2u * SL], tile[t + 3u * SL]);
}
#else
uint base;
#define ROW(ka, kb, ia, ib) (base + uint(ia) * tA + uint(ib) * tB)
vec4 window_values(bool okr, uint row, uint kl) {
    uvec4 il = uvec4(iL0 + int(kl * LL));
    bvec4 ok = lessThan(il, uvec4(sL));
    ok = bvec4(uvec4(ok) & uvec4(okr));
    uvec4 at = row + il * tL;
    vec4 v = vec4(x[ok.x ? at.x : 0u], x[ok.y ? at.y : 0u],
                  x[ok.z ? at.z : 0u], x[ok.w ? at.w : 0u]);
    return mix(vec4(0.0), v, ok);
}
#endif

void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint gy = gl_GlobalInvocationID.y;
    bool live = gx < x_count && gy < AT(extent, RANK - 2);
#ifndef TILE
    if (!live) return;
#endif
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
    uint cl = AT(origin, RANK - 1) + gx * V;
    uint count = min(V, AT(origin, RANK - 1) + AT(extent, RANK - 1) - cl);

    uint sA = R5 ? in_size.x : 1u, sB = in_size[D - 2];
    sL = in_size[D - 1];
    uint tA = R5 ? in_stride[0].z : 0u, tB = AT(in_stride, RANK - 2);
    tL = AT(in_stride, RANK - 1);
    int iA0 = R5 ? int(ca * SA) - start.x : 0;
    int iB0 = int(cb * SB) - start[D - 2];
    iL0 = ivec4(int(cl * SL) - start[D - 1]) + ivec4(0, 1, 2, 3) * int(SL);
    uint gbase = cn * in_stride[0].x + cc * in_stride[0].y - in_base;
#ifdef TILE
    {
        // the tile: WA x hb rows of il_n inputs from the workgroup's first output
        uint lx = gl_WorkGroupSize.x, ly = gl_WorkGroupSize.y;
        hb = (ly - 1u) * SB + (WB - 1u) * LB + 1u;
        il_n = ((lx - 1u) * V + 3u) * SL + (WL - 1u) * LL + 1u;
        uint row0 = AT(origin, RANK - 2) + gl_WorkGroupID.y * ly;
        uint col0 = AT(origin, RANK - 1) + gl_WorkGroupID.x * lx * V;
        int tb0 = int(row0 * SB) - start[D - 2];
        int tl0 = int(col0 * SL) - start[D - 1];
        uint lid = gl_LocalInvocationID.y * lx + gl_LocalInvocationID.x;
        for (uint ka = 0u; ka < WA; ka++) {
            int ia = iA0 + int(ka * LA);
            bool oka = uint(ia) < sA;
            for (uint r = gl_LocalInvocationID.y; r < hb; r += ly) {
                int ib = tb0 + int(r);
                bool okr = oka && uint(ib) < sB;
                uint src = gbase + uint(ia) * tA + uint(ib) * tB;
                uint dst = (ka * hb + r) * il_n;
                for (uint c = gl_LocalInvocationID.x; c < il_n; c += lx) {
                    uint i = uint(tl0 + int(c));
                    uint at = src + i * tL;
                    bool ok = okr && i < sL && at < uint(x.length());   // inside the binding
                    float v = x[ok ? at : 0u];
                    tile[dst + c] = ok ? v : 0.0;
                }
            }
        }
        barrier();
        lrow = gl_LocalInvocationID.y * SB;
        tile_col = gl_LocalInvocationID.x * V * SL;
        if (!live) return;
    }
#else
    base = gbase;
#endif

    vec4 s1 = vec4(0.0), s2 = vec4(0.0), m = vec4(0.0);
    for (uint ka = 0u; ka < WA; ka++) {
        int ia = iA0 + int(ka * LA);
        bool oka = uint(ia) < sA;
        for (uint kb = 0u; kb < WB; kb++) {
            int ib = iB0 + int(kb * LB);
            bool okr = oka && uint(ib) < sB;
            uint row = ROW(ka, kb, ia, ib);
            for (uint kl = 0u; kl < WL; kl++) {
                vec4 v = window_values(okr, row, kl);
                vec4 a = abs(v);
                s1 += a;
                s2 += a * a;
                m = max(m, a);
            }
        }
    }
    vec4 r = P == 1u ? s1 : sqrt(s2);
    // lanes whose sum of squares is not exact enough, or P > 2: scaled again (m < 2^63
    // keeps each square finite, not their sum: 9 squares near 2^126 overflow)
    bvec4 bad = bvec4(uvec4(greaterThan(m, vec4(0.0))) &
                      (uvec4(lessThan(m, vec4(8.8817841970012523e-16))) |
                       uvec4(greaterThanEqual(m, vec4(9.2233720368547758e18))) |
                       uvec4(isinf(s2))));
    bool again = P > 2u || (P == 2u && any(bad));
    for (uint pass = 0u; pass < (again ? 1u : 0u); pass++) {
        // 2^(127 - e) for m's biased exponent e, as two normal factors (P = 2)
        ivec4 e = clamp(ivec4(floatBitsToUint(m) >> 23), 1, 254);
        ivec4 h = (127 - e) / 2;
        vec4 f1 = intBitsToFloat((127 + h) << 23);
        vec4 f2 = intBitsToFloat((127 + (127 - e - h)) << 23);
        vec4 sum = vec4(0.0);
        for (uint ka = 0u; ka < WA; ka++) {
            int ia = iA0 + int(ka * LA);
            bool oka = uint(ia) < sA;
            for (uint kb = 0u; kb < WB; kb++) {
                int ib = iB0 + int(kb * LB);
                bool okr = oka && uint(ib) < sB;
                uint row = ROW(ka, kb, ia, ib);
                for (uint kl = 0u; kl < WL; kl++) {
                    vec4 a = abs(window_values(okr, row, kl));
                    if (P == 2u) {
                        vec4 t = a * f1 * f2;
                        sum += t * t;
                    } else {
                        vec4 t = a / m;
                        sum += vec4(pow_p(t.x), pow_p(t.y), pow_p(t.z), pow_p(t.w));
                    }
                }
            }
        }
        vec4 scaled = P == 2u ? sqrt(sum) / f1 / f2 : m * pow(sum, vec4(1.0 / float(P)));
        scaled = mix(scaled, vec4(0.0), equal(m, vec4(0.0)));
        scaled = mix(scaled, m, isinf(m));
        r = P == 2u ? mix(r, scaled, bad) : scaled;
    }
    r = mix(r, s1, isnan(s1));         // a NaN in the window
    uint o = cn * out_stride[0].x + cc * out_stride[0].y + (R5 ? ca * out_stride[0].z : 0u)
             + cb * AT(out_stride, RANK - 2) + cl * AT(out_stride, RANK - 1) - out_base;
    if (VEC_STORE && count == 4u) {
        y4[o >> 2] = r;
        return;
    }
    uint ostep = AT(out_stride, RANK - 1);
    for (uint j = 0u; j < count; j++) y[o + j * ostep] = r[j];
}
