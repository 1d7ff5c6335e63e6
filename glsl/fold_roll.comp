#version 450
// Fold (col2im, see glsl/fold.comp) in float32 over 2 spatial dimensions (B rows, L
// columns), written for drivers that neither fold specialization constants nor skip the
// blocks no lane takes (SwiftShader, docs/DEVELOPING.md): rolled window loops, no local
// arrays, 4 neighbouring outputs of the last dimension per invocation as one vec4, the
// grid's x along the last dimension only (XDIMS = 1).  Window positions are added in the
// order of glsl/fold.comp (row-major), so the sums are the same.
//
// TILE ("tile"): the workgroup first copies, for each window position k, the block
// rectangle its outputs read into shared memory (each input element once, 0 where no
// block exists), barrier, then adds from there; workgroups are tiles of LOCAL_SIZE_Y rows
// x 4 LOCAL_SIZE_X columns of one (n, c) plane; the host keeps the tile within
// maxComputeSharedMemorySize.
//
// vkml:variant fold_f32_roll F32=1
// vkml:variant fold_f32_tile F32=1 TILE=1

layout(std430, set = 0, binding = 0) readonly buffer In { float x[]; };
layout(std430, set = 0, binding = 1) buffer Out { float y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { vec4 y4[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // 4 here: N, C, B, L
layout(constant_id = 2) const int XDIMS = 1;     // always 1 here
#define VKML_WINDOW_DIMS 2
#include "vkml_window.glsl"
layout(constant_id = 21) const uint V = 4u;      // 4 (1 on short rows)
layout(constant_id = 22) const bool VEC_STORE = false;
#ifdef TILE
layout(constant_id = 25) const uint TILE_SIZE = 1u;   // floats: K * HB * IL (host)
shared float tile[TILE_SIZE];
#endif

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];
    uvec4 in_stride;              // .x N, .y row (C x window), .z column (block)
    ivec4 start[2];
    uvec4 blocks[2];
    uvec4 block_stride[2];
    uint in_texels;
};

#include "vkml_box.glsl"

const uint K = W0 * W1;

void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint gy = gl_GlobalInvocationID.y;
    bool live = gx < x_count && gy < extent[0].z;
#ifndef TILE
    if (!live) return;
#endif
    uint z = gl_GlobalInvocationID.z;
    uint q = divide(z, 1);
    uint cc = origin[0].y + z - q * extent[0].y;
    uint cn = origin[0].x + q;
    uint ob = origin[0].z + gy;
    uint ol = origin[0].w + gx * V;
    uint count = min(V, origin[0].w + extent[0].w - ol);
    uint nb = blocks[0].x, nl = blocks[0].y;
    uint base = cn * in_stride.x + cc * K * in_stride.y - in_base;
    vec4 acc = vec4(0.0);
#ifdef TILE
    // block rectangle of the workgroup: rows [b0, b0 + hb), columns [l0, l0 + il)
    uint lx = gl_WorkGroupSize.x, ly = gl_WorkGroupSize.y;
    uint row0 = origin[0].z + gl_WorkGroupID.y * ly;
    uint col0 = origin[0].w + gl_WorkGroupID.x * lx * V;
    uint hb = ((ly - 1u) + (W0 - 1u) * L0) / S0 + 2u;
    uint il = ((lx - 1u) * V + 3u + (W1 - 1u) * L1) / S1 + 2u;
    // the first block any output of the tile can meet: (o + start - (W-1)*L) / S, floored
    int b0 = int(row0) + start[0].x - int((W0 - 1u) * L0);
    b0 = b0 >= 0 ? b0 / int(S0) : -((-b0 + int(S0) - 1) / int(S0));
    int l0 = int(col0) + start[0].y - int((W1 - 1u) * L1);
    l0 = l0 >= 0 ? l0 / int(S1) : -((-l0 + int(S1) - 1) / int(S1));
    for (uint k = 0u; k < K; k++) {
        for (uint r = gl_LocalInvocationID.y; r < hb; r += ly) {
            int b = b0 + int(r);
            bool okb = uint(b) < nb;
            uint src = base + k * in_stride.y + uint(b) * nl * in_stride.z;
            uint dst = (k * hb + r) * il;
            for (uint c = gl_LocalInvocationID.x; c < il; c += lx) {
                int l = l0 + int(c);
                uint i = src + uint(l) * in_stride.z;
                bool ok = okb && uint(l) < nl && i < uint(x.length());   // inside the binding
                float v = x[ok ? i : 0u];
                tile[dst + c] = ok ? v : 0.0;
            }
        }
    }
    barrier();
    if (!live) return;
#endif
    uint k = 0u;
    for (uint kb = 0u; kb < W0; kb++) {
        int tb = int(ob) + start[0].x - int(kb * L0);
        uint b = uint(tb) / S0;
        bool okb = tb >= 0 && uint(tb) - b * S0 == 0u && b < nb;
        for (uint kl = 0u; kl < W1; kl++, k++) {
            ivec4 tl = ivec4(int(ol) + start[0].y - int(kl * L1)) + ivec4(0, 1, 2, 3);
            uvec4 l = uvec4(tl) / S1;
            bvec4 ok = bvec4(uvec4(greaterThanEqual(tl, ivec4(0))) &
                             uvec4(equal(uvec4(tl) - l * S1, uvec4(0u))) &
                             uvec4(lessThan(l, uvec4(nl))) & uvec4(okb));
#ifdef TILE
            uvec4 at = (k * hb + uint(int(b) - b0)) * il + uvec4(ivec4(l) - l0);
            vec4 v = vec4(tile[ok.x ? at.x : 0u], tile[ok.y ? at.y : 0u],
                          tile[ok.z ? at.z : 0u], tile[ok.w ? at.w : 0u]);
#else
            uvec4 at = base + k * in_stride.y + (b * nl + l) * in_stride.z;
            vec4 v = vec4(x[ok.x ? at.x : 0u], x[ok.y ? at.y : 0u],
                          x[ok.z ? at.z : 0u], x[ok.w ? at.w : 0u]);
#endif
            acc += mix(vec4(0.0), v, ok);
        }
    }
    uint o = cn * out_stride[0].x + cc * out_stride[0].y + ob * out_stride[0].z
             + ol * out_stride[0].w - out_base;
    if (VEC_STORE && count == 4u) {
        y4[o >> 2] = acc;
        return;
    }
    for (uint j = 0u; j < count; j++) y[o + j * out_stride[0].w] = acc[j];
}
